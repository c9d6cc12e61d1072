"""A full-parameter GRPO run (`train.params = "full"`: the weights' float32 masters and AdamW state
in every checkpoint) SIGKILLed after its second checkpoint and restarted with the same command ends
in exactly the state of an uninterrupted run, after the weights moved at every step."""

import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from test_faults_main import _env, _final_state, _finish, _state, kill_after_checkpoint

from essa_jax.checkpointing import complete_steps

ROOT = Path(__file__).resolve().parents[2]
CONFIG = Path(__file__).resolve().parent / "tiny_grpo_full_config.py"
STEPS = 5


def _start(workdir, tmp_path, log):
    cmd = [sys.executable, "-m", "essa_jax.main", f"--config={CONFIG}", f"--workdir={workdir}"]
    return subprocess.Popen(
        cmd, cwd=ROOT, env=_env(tmp_path), stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip


def _weights_moved(a, b) -> float:
    pairs = zip(
        jax.tree.leaves(a["grpo"]["params"]), jax.tree.leaves(b["grpo"]["params"]), strict=True
    )
    return max(float(np.abs(np.asarray(x) - np.asarray(y)).max()) for x, y in pairs)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_full_parameter_sigkill_then_resume_equals_uninterrupted(tmp_path):
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    with open(tmp_path / "ref.log", "wb") as log:
        _finish(_start(ref, tmp_path, log), 600, tmp_path / "ref.log")
    assert complete_steps(str(ref / "checkpoints")) == list(range(STEPS + 1))
    states = [_state(ref, s) for s in range(STEPS + 1)]
    for s in range(STEPS):  # first: every step moved the weights (lr 1e-3: ~1e-3 per weight)
        assert _weights_moved(states[s], states[s + 1]) > 1e-4, s

    done = kill_after_checkpoint(_start, cut, tmp_path, 2)
    assert max(done) < STEPS, done
    with open(tmp_path / "cut2.log", "wb") as log:
        _finish(_start(cut, tmp_path, log), 600, tmp_path / "cut2.log")
    assert f"resuming from {cut}/checkpoints/{max(done)}" in (tmp_path / "cut2.log").read_text()

    step_ref, state_ref, _ = _final_state(ref)
    step_cut, state_cut, _ = _final_state(cut)
    assert step_ref == step_cut == STEPS
    assert _weights_moved(_state(cut, max(done)), state_cut) > 1e-4  # the redone steps moved
    flat_ref = jax.tree_util.tree_flatten_with_path(state_ref)[0]
    flat_cut = dict(jax.tree_util.tree_flatten_with_path(state_cut)[0])
    assert len(flat_ref) == len(flat_cut) > 20  # masters, AdamW m and v, key, cursor
    for path, leaf in flat_ref:
        np.testing.assert_array_equal(
            np.asarray(flat_cut[path]), np.asarray(leaf), err_msg=jax.tree_util.keystr(path)
        )
    model = cut / "model"  # the exported Hugging Face checkpoint
    assert (model / "config.json").is_file() and list(model.glob("model-*.safetensors"))
