"""End to end on a tiny random model (random:tiny + char tokenizer) and generated 2-digit
addition: every pipeline runs, writes its artefacts, and resumes bit-exactly."""

import os

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from safetensors.numpy import load_file
from search_moved import assert_essa_moved, lora_movement

from essa_jax.checkpointing import WorkdirError
from essa_jax.config import base_config
from essa_jax.train import train_and_evaluate
from essa_jax.train.metrics import read_metrics, without_measurements

pytestmark = pytest.mark.slow


def tiny_config(method: str, steps: int = 4):
    c = base_config()
    c.method = method
    c.model.path = "random:tiny"
    c.task.num_train = 64
    c.task.num_heldout = 8
    c.sft.steps = 2
    c.sft.batch_size = 4
    c.essa.population_size = 4
    c.essa.prompts_per_candidate = 4
    c.essa.generations = steps
    c.essa.greedy = False  # random model: sampled rollouts give the strategy fitness spread
    c.grpo.steps = steps
    c.grpo.batch_size = 8
    c.grpo.group_size = 4
    c.grpo.learning_rate = 1e-2
    if method == "fgrpo":
        c.grpo.focal_gamma = 0.5
    c.generation.max_new_tokens = 3
    c.eval.every = 2
    c.eval.batch_size = 8
    c.checkpoint.every = 2
    return c


def moving_config(method: str, steps: int):
    """tiny_config with the dense `char_match` fitness: a random model never solves add_2d (reward
    0 everywhere: CMA-ES skips every tell, GRPO's advantages are 0), while char_match grades every
    completion, so the search state moves at every step."""
    c = tiny_config(method, steps)
    c.task.reward = "char_match"
    return c


# Least movement of the search state over 2 steps (observed for the 2 halves of the 4-step runs:
# ESSA mean 1.15 / 0.82, |log sigma| 0.052 / 0.041, covariance 0.020 / 0.022; GRPO LoRA 0.60 /
# 0.46; L2 / Frobenius norms). Weight decay alone moves the LoRA by ~6e-4 over 2 steps.
ESSA_MOVED = {"mean": 0.3, "log_sigma": 1e-2, "covariance": 5e-3}
GRPO_MOVED = 0.1


def assert_search_moved(method: str, start: dict, end: dict, what: str) -> None:
    """The search state (CMA-ES distribution / trained LoRA; not the counters, key or cursor,
    which change whatever the search does) moved from `start` to `end`."""
    if method == "essa":
        assert_essa_moved(start, end, **ESSA_MOVED, what=what)
    else:
        moved = lora_movement(start["grpo"]["params"], end["grpo"]["params"])
        assert moved > GRPO_MOVED, f"{what} the LoRA moved {moved:.3g}, not > {GRPO_MOVED}"


def final_state(workdir: str, step: int) -> dict:
    path = os.path.join(workdir, "checkpoints", str(step), "state")
    return ocp.StandardCheckpointer().restore(os.path.abspath(path))


def rows(workdir: str) -> list[dict]:
    return without_measurements(read_metrics(workdir))


def check_artefacts(workdir: str, summary: dict, steps: int) -> None:
    for name in ("metrics.jsonl", "summary.json", "curves.png", "config.json"):
        assert os.path.getsize(os.path.join(workdir, name)) > 0, name
    assert any(f.startswith("events.out") for f in os.listdir(os.path.join(workdir, "tb")))
    adapter = load_file(os.path.join(workdir, "adapter", "adapter_model.safetensors"))
    assert len(adapter) == 2 * 2 * 4  # 2 layers x (A, B) x q/k/v/o
    assert summary["steps"] == steps and summary["heldout_n"] == 8
    r = rows(workdir)
    assert [x["step"] for x in r if x["phase"] == "train"] == list(range(1, steps + 1))
    assert [x["step"] for x in r if x["phase"] == "eval"] == [0, 2, 4][: steps // 2 + 1]
    tokens = [x["tokens"] for x in r if x["phase"] == "train"]
    assert all(b > a for a, b in zip(tokens, tokens[1:], strict=False))


@pytest.mark.parametrize("method", ["essa", "grpo"])
def test_resume_is_exact(method, tmp_path):
    full, split = str(tmp_path / "full"), str(tmp_path / "split")
    summary = train_and_evaluate(moving_config(method, 4), full, verbose=False)
    check_artefacts(full, summary, 4)
    train_and_evaluate(moving_config(method, 2), split, verbose=False)  # "interrupted" after 2
    # First: the search moved before the interruption and after the resume; an unmoved state
    # would make the equality below vacuous.
    start, middle = final_state(split, 0), final_state(split, 2)
    assert_search_moved(method, start, middle, "steps 1-2:")
    with pytest.raises(WorkdirError, match="already holds checkpoints"):
        train_and_evaluate(moving_config(method, 4), split, resume=False, verbose=False)
    resumed = train_and_evaluate(moving_config(method, 4), split, resume=True, verbose=False)
    assert_search_moved(method, middle, final_state(split, 4), "resumed steps 3-4:")

    a, b = final_state(full, 4), final_state(split, 4)
    leaves_a, leaves_b = ([np.asarray(x) for x in jax.tree.leaves(t)] for t in (a, b))
    assert len(leaves_a) == len(leaves_b) > 0
    for x, y in zip(leaves_a, leaves_b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert rows(full) == rows(split)
    if method == "essa":  # every generation's fitness ranked the members: no tell was skipped
        assert [r["skipped_tell"] for r in rows(full) if r["phase"] == "train"] == [0.0] * 4
    assert resumed["final_heldout_acc"] == summary["final_heldout_acc"]


def test_resume_requires_checkpoint(tmp_path):
    with pytest.raises(WorkdirError, match="no complete checkpoint"):
        train_and_evaluate(tiny_config("essa"), str(tmp_path), resume=True, verbose=False)


@pytest.mark.parametrize("method", ["fgrpo", "svdgrpo", "sft"])
def test_pipeline_end_to_end(method, tmp_path):
    c = tiny_config(method, 2)
    if method == "fgrpo":
        c.eval.pass_k_samples = 4
        c.eval.pass_k = (1, 4)
        c.eval.pass_k_problems = 4
    s = train_and_evaluate(c, str(tmp_path), verbose=False)
    if method == "sft":
        assert s["steps"] == 0 and os.path.exists(tmp_path / "adapter" / "adapter_config.json")
        return
    check_artefacts(str(tmp_path), s, 2)
    if method == "fgrpo":
        assert 0.0 <= s["pass_at_1"] <= s["pass_at_4"] <= 1.0
    if method == "svdgrpo":
        # Only the genome (offsets to the SFT singular values: 4 targets x 2 factors x 2 layers
        # x rank 4) is trainable; the SVD basis is frozen. (The random model earns no reward, so
        # the genome gets no gradient here; the rl package tests the updates.)
        st, st0 = final_state(str(tmp_path), 2), final_state(str(tmp_path), 0)
        g0 = np.asarray(st0["grpo"]["params"])
        assert g0.shape == (64,) and not g0.any()
        assert np.asarray(st["grpo"]["params"]).shape == (64,)
        for x, y in zip(jax.tree.leaves(st["frozen"]), jax.tree.leaves(st0["frozen"]), strict=True):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("method", ["essa", "grpo"])
def test_pipeline_with_a_model_axis(method, tmp_path):
    # mesh.model = 2 on 8 devices: the weights split over the model axis for every program (SFT,
    # ESSA's population or GRPO's data-parallel steps, held-out evaluation), end to end.
    c = tiny_config(method, 2)
    c.mesh.model = 2
    s = train_and_evaluate(c, str(tmp_path), verbose=False)
    check_artefacts(str(tmp_path), s, 2)
    ref = train_and_evaluate(tiny_config(method, 2), str(tmp_path / "ref"), verbose=False)
    # The SFT start is the same run on another layout: equal within float rounding.
    assert abs(s["sft_heldout_acc"] - ref["sft_heldout_acc"]) <= 1 / 8
