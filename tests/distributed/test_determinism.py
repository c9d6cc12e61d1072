"""Same seed, same ESSA steps on 1 device, 1 process x 8 devices and 2 processes x 4 devices.

The worker (essa_worker.py) runs essa_generation with the population sharded over a mesh of every
process's devices; each process scores its own rows and only per-row scores are gathered. With the
log-probability score, layouts with the same per-device batch (1x8 and 2x4: one member per device)
must agree bit for bit; against 1 device (all 8 members in one batch) the fitness may differ in the
last bits (XLA's CPU matmul blocking depends on the batch), but never the ranking, so the CMA-ES
mean must still be bit-identical. With a score of the greedy tokens alone, the fitness must be
identical on all three layouts.
"""

import sys
from pathlib import Path

import numpy as np
import pytest
from procs import run_checked, worker_env

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = ROOT / "experiments" / "launch_local.py"
WORKER = Path(__file__).resolve().parent / "essa_worker.py"
GENERATIONS = "3"


@pytest.mark.multiprocess
@pytest.mark.slow
def test_essa_same_result_on_1_device_1x8_and_2x4(tmp_path):
    py = sys.executable
    for devices in (1, 8):
        run_checked(
            [py, str(WORKER), str(tmp_path / f"d{devices}"), GENERATIONS],
            worker_env(tmp_path, devices),
        )
    run_checked(
        [
            py,
            str(LAUNCHER),
            "-n",
            "2",
            "--devices-per-process",
            "4",
            "--timeout",
            "400",
            "--",
            py,
            str(WORKER),
            str(tmp_path / "p2"),
            GENERATIONS,
        ],
        worker_env(tmp_path),
    )

    one = np.load(tmp_path / "d1" / "p0.npz")
    eight = np.load(tmp_path / "d8" / "p0.npz")
    ranks = [np.load(tmp_path / "p2" / f"p{i}.npz") for i in range(2)]
    assert int(one["devices"]) == 1 and int(eight["devices"]) == 8
    assert all(int(r["devices"]) == 8 and int(r["processes"]) == 2 for r in ranks)
    fit = one["fitness"]
    assert fit.shape == (3, 8) and np.ptp(fit, axis=1).min() > 1e-3  # members really differ

    for r in ranks:
        # Both processes hold the same fitness and genome, equal to one process's bit for bit.
        np.testing.assert_array_equal(r["fitness"], eight["fitness"])
        np.testing.assert_array_equal(r["mean"], eight["mean"])
        np.testing.assert_array_equal(r["sigma"], eight["sigma"])
    np.testing.assert_allclose(eight["fitness"], fit, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(np.argsort(-eight["fitness"], axis=1), np.argsort(-fit, axis=1))
    np.testing.assert_array_equal(eight["mean"], one["mean"])
    assert np.abs(one["mean"]).max() > 0  # the strategy moved

    # The exact score (greedy tokens only): identical fitness on 1 device, 8 and 2 x 4.
    tok = one["token_fitness"]
    assert np.ptp(tok, axis=1).min() > 0  # members really differ
    for other in (eight, *ranks):
        np.testing.assert_array_equal(other["token_fitness"], tok)
        np.testing.assert_array_equal(other["token_mean"], one["token_mean"])
    assert np.abs(one["token_mean"]).max() > 0
