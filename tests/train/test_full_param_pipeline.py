"""Full-parameter runs end to end (`train.params`, `lora.full`) on the tiny random model: GRPO
from full-parameter SFT resumes bit-exactly, and the run exports the trained model as a Hugging
Face checkpoint that loads back as the final weights; `train.params` is validated."""

import os

import jax
import numpy as np
import pytest
from test_pipelines import final_state, moving_config, rows

from essa_jax.config import ConfigError
from essa_jax.lora.full import merge_weights
from essa_jax.models import load_pretrained
from essa_jax.models.tiny import tiny_model
from essa_jax.train import train_and_evaluate, validate_config

pytestmark = pytest.mark.slow


def full_config(steps: int, subset: str = "full"):
    c = moving_config("grpo", steps)
    c.train.params = subset
    c.grpo.learning_rate = 1e-3
    return c


def _movement(a, b) -> float:
    return max(
        float(np.abs(np.asarray(x) - np.asarray(y)).max())
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def test_full_parameter_grpo_resumes_exactly_and_exports_the_model(tmp_path):
    full, split = str(tmp_path / "full"), str(tmp_path / "split")
    summary = train_and_evaluate(full_config(4), full, verbose=False)
    train_and_evaluate(full_config(2), split, verbose=False)
    start, middle = final_state(split, 0), final_state(split, 2)
    assert _movement(start["grpo"]["params"], middle["grpo"]["params"]) > 1e-4
    resumed = train_and_evaluate(full_config(4), split, resume=True, verbose=False)
    end = final_state(split, 4)
    assert _movement(middle["grpo"]["params"], end["grpo"]["params"]) > 1e-4
    a = final_state(full, 4)
    leaves_a, leaves_b = (jax.tree.leaves(t) for t in (a, end))
    assert len(leaves_a) == len(leaves_b) > 0
    for x, y in zip(leaves_a, leaves_b, strict=True):  # weights, AdamW state, key, cursor
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert rows(full) == rows(split)
    assert resumed["final_heldout_acc"] == summary["final_heldout_acc"]

    # The exported model is the final masters in the base's dtype; no PEFT adapter.
    assert not os.path.exists(os.path.join(full, "adapter"))
    config, params = load_pretrained(os.path.join(full, "model"))
    c = full_config(4)
    want_config, base = tiny_model(c.model.path[len("random:") :], c.seed, np.float32)
    assert config == want_config
    want = merge_weights(a["grpo"]["params"], base)
    assert _movement(want, base) > 1e-4
    for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_train_params_is_validated():
    c = full_config(2)
    c.train.params = "everything"
    with pytest.raises(ConfigError, match="train.params"):
        validate_config(c)
    c = full_config(2)
    c.method = "essa"
    with pytest.raises(ConfigError, match="'lora' for method 'essa'"):
        validate_config(c)
    c = full_config(2)
    c.model.quantize = "int8"
    with pytest.raises(ConfigError, match="quantised weights have no gradient"):
        validate_config(c)
    validate_config(full_config(2, "projections"))


def test_full_parameter_run_starts_from_the_lora_sft_model(tmp_path):
    """`train.sft_params = "lora"`: the full-parameter loop starts from the base with the LoRA SFT
    adapter of the adapter methods (same seed: the same adapter, the same held-out score) folded
    into its weights, not from the raw base nor from a full-parameter SFT."""
    lora_wd, full_wd = str(tmp_path / "lora"), str(tmp_path / "full")
    lora_summary = train_and_evaluate(moving_config("grpo", 2), lora_wd, verbose=False)
    c = full_config(2)
    c.train.sft_params = "lora"
    full_summary = train_and_evaluate(c, full_wd, verbose=False)
    assert full_summary["sft_heldout_acc"] == lora_summary["sft_heldout_acc"]

    adapter = final_state(lora_wd, 0)["grpo"]["params"]  # the SFT adapter (checkpoint 0)
    start = final_state(full_wd, 0)["grpo"]["params"]  # the full-parameter loop's first masters
    _, base = tiny_model(c.model.path[len("random:") :], c.seed, np.float32)
    scale = c.lora.alpha / c.lora.rank
    assert set(adapter) == set(c.lora.targets)
    moved = 0.0
    for t, ad in adapter.items():
        w = np.asarray(base["layers"][t]["kernel"], np.float64)
        delta = scale * np.einsum("lri,lor->lio", np.asarray(ad["a"]), np.asarray(ad["b"]))
        moved = max(moved, float(np.abs(delta).max()))
        got = np.asarray(start["layers"][t]["kernel"])
        assert got.dtype == np.float32
        # float32 rounding of W + delta (and of the rank-r product: r terms)
        tol = 8 * np.finfo(np.float32).eps * float(np.abs(w).max() + np.abs(delta).max())
        np.testing.assert_allclose(got, w + delta, rtol=0, atol=tol, err_msg=t)
    assert moved > 1e-3  # SFT moved the adapter: the check above could tell the base apart
    for name in ("gate", "up", "down"):  # not LoRA targets: the base's weights as they are
        np.testing.assert_array_equal(
            start["layers"][name]["kernel"], np.asarray(base["layers"][name]["kernel"])
        )


def test_sft_params_is_validated():
    c = full_config(2)
    c.train.sft_params = "adapter"
    with pytest.raises(ConfigError, match="train.sft_params"):
        validate_config(c)
