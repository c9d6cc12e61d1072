"""GRPO rollouts in row chunks (`GRPOConfig.rows_per_chunk`): every chunk size > 0 samples the same
rollouts (row r with fold_in(key, r)); 0 is the one-key batch of `models.generate`, unchanged."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from essa_jax.lora import LoraConfig, init_lora
from essa_jax.models import generate_jit
from essa_jax.models.tiny import tiny_model
from essa_jax.rl import FrozenPolicy, GRPOConfig, GRPOConfigError, GRPOTrainer

GROUP, NEW = 4, 5


def _rollouts(rows_per_chunk, params, config, lora, toks, mask, key):
    cfg = GRPOConfig(
        group_size=GROUP, max_new_tokens=NEW, temperature=0.9, rows_per_chunk=rows_per_chunk
    )
    trainer = GRPOTrainer(config, cfg, reward_fn=lambda *a, **k: [], decode=str)
    return trainer.rollout(FrozenPolicy(base=params), lora, toks, mask, key)


def test_chunked_rollouts_are_identical_and_zero_is_unchanged():
    config, params = tiny_model("tiny")
    lora = init_lora(jax.random.key(0), config, LoraConfig(rank=2, alpha=4.0))
    lora = {
        t: a.replace(b=0.3 * jax.random.normal(jax.random.key(1), a.b.shape))
        for t, a in lora.items()
    }
    toks = jax.random.randint(jax.random.key(2), (3, 4), 3, 99).astype(jnp.int32)
    mask = jnp.ones_like(toks)
    key = jax.random.key(5)
    # 12 rows: chunks of 2 and 3 divide them, 5 does not (padded to 15), 12 is one chunk.
    runs = {c: _rollouts(c, params, config, lora, toks, mask, key) for c in (12, 2, 3, 5)}
    ref = runs[12]
    for c, got in runs.items():
        for name in ("tokens", "mask", "lengths", "finished"):
            np.testing.assert_array_equal(getattr(got, name), getattr(ref, name), err_msg=f"{c}")
        # Float rounding only: XLA's kernels round a batch of 2 rows unlike one of 12.
        np.testing.assert_allclose(got.logprobs, ref.logprobs, rtol=0, atol=2e-6)
    assert len({tuple(np.asarray(r).tolist()) for r in ref.tokens}) > 1  # really sampled
    # rows_per_chunk=0: the one-key batch sampling of models.generate, as before chunking existed.
    zero = _rollouts(0, params, config, lora, toks, mask, key)
    want = generate_jit(
        params, config, jnp.repeat(toks, GROUP, 0), jnp.repeat(mask, GROUP, 0), key,
        max_new_tokens=NEW, temperature=0.9, lora=lora,
    )  # fmt: skip
    for name in ("tokens", "logprobs", "mask", "lengths", "finished"):
        np.testing.assert_array_equal(getattr(zero, name), getattr(want, name))


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_rows_per_chunk_is_validated(bad):
    with pytest.raises(GRPOConfigError, match="rows_per_chunk"):
        GRPOConfig(rows_per_chunk=bad)
