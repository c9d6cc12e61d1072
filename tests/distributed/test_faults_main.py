"""Faults against the main job (`python -m essa_jax.main`, tiny random model, ESSA).

A run SIGKILLed mid-run (possibly while orbax writes a checkpoint) and restarted with the same
command resumes from the last complete checkpoint and ends in exactly the state of an uninterrupted
run: no generation lost or repeated. The run's fitness is dense (tiny_essa_config.py), so the
CMA-ES state moves every generation; the test asserts that first, then that the resume is exact.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from search_moved import TINY_ESSA_PER_GENERATION as PER_GENERATION
from search_moved import assert_essa_moved

from essa_jax.checkpointing import complete_steps

ROOT = Path(__file__).resolve().parents[2]
CONFIG = Path(__file__).resolve().parent / "tiny_essa_config.py"
GENERATIONS = 5
# Every checkpoint kept: the test measures the search's movement generation by generation.
OVERRIDES = [f"--config.essa.generations={GENERATIONS}", "--config.checkpoint.keep=10"]


def _env(tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
    }
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
    env["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path / "jax_cache")
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    return env


def _cmd(workdir):
    return [
        sys.executable,
        "-m",
        "essa_jax.main",
        f"--config={CONFIG}",
        f"--workdir={workdir}",
        *OVERRIDES,
    ]


def _start(workdir, tmp_path, log):
    return subprocess.Popen(
        _cmd(workdir),
        cwd=ROOT,
        env=_env(tmp_path),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _finish(p, timeout, log_path):
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        pytest.fail(f"main did not finish in {timeout}s:\n{Path(log_path).read_text()[-3000:]}")
    assert p.returncode == 0, Path(log_path).read_text()[-4000:]


def _state(workdir, step):
    path = os.path.join(workdir, "checkpoints", str(step), "state")
    return ocp.StandardCheckpointer().restore(path)


def _final_state(workdir):
    d = os.path.join(workdir, "checkpoints")
    last = complete_steps(d)[-1]
    state = _state(workdir, last)
    with open(os.path.join(d, str(last), "meta", "metadata")) as f:
        meta = json.load(f)
    return last, state, meta


def kill_after_checkpoint(start, workdir, tmp_path, step: int) -> list[int]:
    """Start a run (`start(workdir, tmp_path, log)`), SIGKILL its process group as soon as
    checkpoint `step` is complete, and return the complete steps left (log: cut1.log)."""
    with open(tmp_path / "cut1.log", "wb") as log:
        p = start(workdir, tmp_path, log)
        deadline = time.monotonic() + 600
        while step not in complete_steps(str(workdir / "checkpoints")):
            assert p.poll() is None, (tmp_path / "cut1.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"no checkpoint {step} within 600 s"
            time.sleep(0.05)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    assert p.returncode == -signal.SIGKILL
    done = complete_steps(str(workdir / "checkpoints"))
    assert step in done, done
    return done


@pytest.mark.multiprocess
@pytest.mark.slow
def test_sigkill_mid_run_then_resume_equals_uninterrupted(tmp_path):
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    with open(tmp_path / "ref.log", "wb") as log:
        _finish(_start(ref, tmp_path, log), 600, tmp_path / "ref.log")
    # First: the uninterrupted run's search moved at every generation (else "equal" is vacuous).
    assert complete_steps(str(ref / "checkpoints")) == list(range(GENERATIONS + 1))
    ref_states = [_state(ref, s) for s in range(GENERATIONS + 1)]
    for g in range(GENERATIONS):
        assert_essa_moved(ref_states[g], ref_states[g + 1], **PER_GENERATION, what=f"gen {g + 1}:")

    # Kill as soon as generation 2's checkpoint is complete: the loop is then running
    # generation 3 or already writing its checkpoint.
    done = kill_after_checkpoint(_start, cut, tmp_path, 2)
    assert max(done) < GENERATIONS, done

    with open(tmp_path / "cut2.log", "wb") as log:
        _finish(_start(cut, tmp_path, log), 600, tmp_path / "cut2.log")
    resumed_log = (tmp_path / "cut2.log").read_text()
    assert f"resuming from {cut}/checkpoints/{max(done)}" in resumed_log

    step_ref, state_ref, meta_ref = _final_state(ref)
    step_cut, state_cut, meta_cut = _final_state(cut)
    assert step_ref == step_cut == GENERATIONS
    # The generations redone after the kill moved the state too.
    assert_essa_moved(_state(cut, max(done)), state_cut, **PER_GENERATION, what="resumed:")
    assert int(state_cut["step"]) == GENERATIONS
    flat_ref = jax.tree_util.tree_flatten_with_path(state_ref)[0]
    flat_cut = dict(jax.tree_util.tree_flatten_with_path(state_cut)[0])
    assert len(flat_ref) == len(flat_cut)
    for path, leaf in flat_ref:
        np.testing.assert_array_equal(
            np.asarray(flat_cut[path]), np.asarray(leaf), err_msg=jax.tree_util.keystr(path)
        )

    def train_rows(meta):
        return [
            (r["step"], r["reward"], r["sigma"], r["update_norm"])
            for r in meta["history"]
            if r["phase"] == "train"
        ]

    # Every generation logged exactly once, with the same numbers as the uninterrupted run.
    assert [r[0] for r in train_rows(meta_cut)] == list(range(1, GENERATIONS + 1))
    assert train_rows(meta_cut) == train_rows(meta_ref)
