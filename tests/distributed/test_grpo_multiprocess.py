"""A data-parallel GRPO step (and an SFT step) on 2 processes x 4 devices equals the step on
1 process x 8 devices, and each process generates and rewards only half of the rollouts.

The worker (grpo_worker.py) runs `GRPOTrainer(mesh=...).step`: one rollout program sharded over
every process's devices, each process reading back and rewarding only its devices' rows, per-row
rewards all-gathered, the update data-parallel. Both layouts put 2 rollouts on each of 8 devices,
so they compute the same programs per device.
"""

import sys
from pathlib import Path

import numpy as np
import pytest
from procs import run_checked, worker_env

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = ROOT / "experiments" / "launch_local.py"
WORKER = Path(__file__).resolve().parent / "grpo_worker.py"
ROLLOUTS = 16


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("trained", ["lora", "full"])
def test_grpo_two_processes_equal_one_and_split_the_rollouts(tmp_path, trained):
    """trained = "full": every weight (`lora.full`), its state split over the data axis of both
    processes' devices (ZeRO)."""
    py = sys.executable
    run_checked([py, str(WORKER), str(tmp_path / "one"), trained], worker_env(tmp_path, 8))
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
            str(tmp_path / "two"),
            trained,
        ],
        worker_env(tmp_path),
    )
    one = np.load(tmp_path / "one" / "p0.npz")
    two = [np.load(tmp_path / "two" / f"p{i}.npz") for i in range(2)]
    assert int(one["devices"]) == 8 and int(one["processes"]) == 1
    assert all(int(r["devices"]) == 8 and int(r["processes"]) == 2 for r in two)
    # First: the step moved the LoRA (L2 over all factors; observed 0.46), far beyond the
    # 2e-6 tolerance of the comparison below, on both layouts; rewards differ: a real gradient.
    for r in (one, *two):
        assert float(r["moved"]) > 0.1, float(r["moved"])
    assert 0 < float(one["reward_mean"]) < 1
    # One process rewards every rollout; two processes half each, and nobody repeats a rollout.
    assert int(one["rewarded"]) == ROLLOUTS and int(one["local_rollouts"]) == ROLLOUTS
    for r in two:
        assert int(r["rewarded"]) == ROLLOUTS // 2 and int(r["local_rollouts"]) == ROLLOUTS // 2
    arrays = [k for k in one.files if k.startswith("arr_")]
    # GRPO then SFT: the LoRA's (a, b) x q/k/v/o, or the toy model's 11 weight leaves (embed,
    # final norm, 2 layer norms, 7 kernels; tied head, no biases).
    assert len(arrays) == (2 * 2 * 4 if trained == "lora" else 2 * 11)
    for r in two:
        assert float(r["reward_mean"]) == float(one["reward_mean"])
        np.testing.assert_allclose(float(r["loss"]), float(one["loss"]), rtol=1e-5)
        for k in arrays:
            np.testing.assert_allclose(r[k], one[k], rtol=0, atol=2e-6, err_msg=k)
