"""The main job (`python -m essa_jax.main`) on two jax.distributed processes equals one process.

Two local processes (experiments/launch_local.py, gloo over 127.0.0.1, one CPU device each) run a
few ESSA generations of the tiny random model with a dense reward; each scores half of every
generation's members and all-gather the fitness. Greedy fitness is deterministic, so every logged
generation and the final checkpointed state (strategy mean, covariance, key, cursor) must equal
those of a single process, bit for bit. Only process 0 writes the result files.

The 2-process run is done in two launches: 2 generations, then (newest checkpoint truncated) a
relaunch with 3 that falls back to checkpoint 1 on both processes and redoes generations 2 and 3.
The fitness is dense (tiny_essa_config.py): before comparing, the test asserts that the CMA-ES
state moved at every generation of the 1-process run and over the 2-process run's redone ones.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from search_moved import TINY_ESSA_PER_GENERATION, assert_essa_moved

from essa_jax.checkpointing import complete_steps
from essa_jax.train.metrics import read_metrics, without_measurements

ROOT = Path(__file__).resolve().parents[2]
CONFIG = Path(__file__).resolve().parent / "tiny_essa_dense_config.py"
GENERATIONS = 3
TIMEOUT_S = 400


def _env(tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
    }
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
    env["JAX_PLATFORMS"] = "cpu"
    # One compilation cache for the three launches: the relaunch compiles (almost) nothing.
    env["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path / "jax_cache")
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    return env


def _main_cmd(workdir, generations=GENERATIONS):
    return [
        sys.executable,
        "-m",
        "essa_jax.main",
        f"--config={CONFIG}",
        f"--workdir={workdir}",
        f"--config.essa.generations={generations}",
        "--config.checkpoint.every=1",
        "--config.checkpoint.keep=4",  # all steps: movement is checked per generation
    ]


def _launch_two(workdir, generations):
    return [
        sys.executable,
        str(ROOT / "experiments" / "launch_local.py"),
        "-n",
        "2",
        "--devices-per-process",
        "1",
        "--timeout",
        str(TIMEOUT_S - 20),
        "--",
        *_main_cmd(workdir, generations),
    ]


def _start(cmd, log_path):
    log = open(log_path, "wb")
    p = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=_env(Path(log_path).parent),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    return p


def _wait(p, log_path):
    try:
        p.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        pytest.fail(f"no exit within {TIMEOUT_S}s:\n{Path(log_path).read_text()[-3000:]}")
    assert p.returncode == 0, Path(log_path).read_text()[-4000:]
    return Path(log_path).read_text()


def _final(workdir):
    last = complete_steps(os.path.join(workdir, "checkpoints"))[-1]
    return last, _load(workdir, last)


def _load(workdir, step):
    path = os.path.join(workdir, "checkpoints", str(step), "state")
    ckptr = ocp.StandardCheckpointer()
    # Saved replicated over 2 processes' devices: restore onto this process's first device.
    one_device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    meta = ckptr.metadata(path).item_metadata.tree
    target = jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=one_device), meta
    )
    return ckptr.restore(path, target)


def _train_rows(workdir):
    return without_measurements(r for r in read_metrics(workdir) if r["phase"] == "train")


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_processes_equal_one(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    # Both at once: the reference and the 2-process run share the wall-clock.
    ref = _start(_main_cmd(one), tmp_path / "one.log")
    first = _start(_launch_two(two, 2), tmp_path / "two_a.log")
    log = _wait(first, tmp_path / "two_a.log")
    assert "process 1/2" in log and "process 0/2" in log, log[-3000:]
    d = two / "checkpoints"
    assert complete_steps(str(d)) == [0, 1, 2]
    for root, _, files in os.walk(d / "2" / "state"):
        for f in files:
            with open(os.path.join(root, f), "r+b") as fh:
                fh.truncate(0)
    relaunch = _start(_launch_two(two, GENERATIONS), tmp_path / "two_b.log")
    log = _wait(relaunch, tmp_path / "two_b.log")
    assert "CheckpointFallbackWarning" in log and f"resuming from {two}/checkpoints/1" in log, log
    assert any(n.startswith("2.corrupt-") for n in os.listdir(d))
    _wait(ref, tmp_path / "one.log")

    # First: the search moved, at every generation of the reference and over the generations
    # the 2-process relaunch redid from checkpoint 1 (else the equalities below are vacuous).
    states_one = [_load(one, s) for s in range(GENERATIONS + 1)]
    for g in range(GENERATIONS):
        assert_essa_moved(
            states_one[g], states_one[g + 1], **TINY_ESSA_PER_GENERATION, what=f"gen {g + 1}:"
        )
    assert_essa_moved(
        _load(two, 1), _load(two, GENERATIONS), **TINY_ESSA_PER_GENERATION, what="2 processes:"
    )

    rows_one, rows_two = _train_rows(one), _train_rows(two)
    # One row per generation: process 1 appended nothing to the shared metrics file.
    assert [r["step"] for r in rows_two] == list(range(1, GENERATIONS + 1))
    assert rows_two == rows_one
    # The fitness varied, so the gathered order of members mattered to the update.
    assert all(r["reward_std"] > 0 and r["skipped_tell"] == 0.0 for r in rows_one)

    step_one, state_one = _final(one)
    step_two, state_two = _final(two)
    assert step_one == step_two == GENERATIONS
    flat_one = jax.tree_util.tree_flatten_with_path(state_one)[0]
    flat_two = dict(jax.tree_util.tree_flatten_with_path(state_two)[0])
    assert len(flat_one) == len(flat_two)
    for path, leaf in flat_one:
        a, b = np.asarray(flat_two[path]), np.asarray(leaf)
        if np.issubdtype(b.dtype, np.floating):
            # The SFT step is data-parallel over the processes' devices: its gradient sums in
            # another order than on one device, so the SFT adapter (and the SVD basis from it)
            # agree to float rounding; the search on top of it gave identical metrics above.
            np.testing.assert_allclose(
                a, b, rtol=2e-5, atol=1e-6, err_msg=jax.tree_util.keystr(path)
            )
        else:
            np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))

    s_one = json.loads((one / "summary.json").read_text())
    s_two = json.loads((two / "summary.json").read_text())
    for k in ("final_heldout_acc", "generated_tokens", "steps"):
        assert s_two[k] == s_one[k], k
    assert (two / "adapter").is_dir()
