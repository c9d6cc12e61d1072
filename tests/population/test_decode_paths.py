"""The decode path accelerators take (the layer scan) against the CPU path (layers unrolled over
per-layer weight copies), through `generate` and the population engine, on this CPU.

`models.generate` picks the unrolled loop on CPU and the scan elsewhere; `decode_layers("scan")`
forces the accelerators' choice, so the path a GPU or TPU runs is exercised here token for token:
greedy tokens equal, log-probs to float32 rounding, for plain, LoRA-adapted, sampled (per-row keys)
and population generation.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from pop_helpers import left_padded, setup

from essa_jax.models import generate_jit
from essa_jax.models.generate import decode_layers
from essa_jax.population import population_generate

N = 6


def _both(fn):
    """fn() under the CPU default (unrolled) and under the accelerator path (scan)."""
    with decode_layers("unrolled"):
        a = jax.device_get(fn())
    with decode_layers("scan"):
        b = jax.device_get(fn())
    return a, b


def _same(a, b):
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.mask, b.mask)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=2e-5)
    # Not vacuous: the decode produced real tokens of more than one kind.
    assert a.mask.sum() > 0 and len(np.unique(a.tokens[a.mask == 1])) > 1


@pytest.mark.parametrize("adapter", [False, True])
@pytest.mark.parametrize("greedy", [True, False])
def test_generate_scan_equals_unrolled(adapter, greedy):
    config, params, sft, _, _ = setup("qwen2")
    tokens, mask = left_padded(3, (4, 7), config.vocab_size)
    key = jax.random.split(jax.random.key(1), 4)  # per-row keys, as the population uses

    def run():
        return generate_jit(
            params,
            config,
            jnp.asarray(tokens),
            jnp.asarray(mask),
            key,
            max_new_tokens=N,
            greedy=greedy,
            eos_token_ids=(),
            lora=sft if adapter else None,
        )

    _same(*_both(run))


def test_population_scan_equals_unrolled():
    config, params, _, basis, layout = setup("llama")
    tokens, mask = left_padded(5, (3, 6), config.vocab_size)
    genomes = 0.5 * jax.random.normal(jax.random.key(2), (4, layout.size))

    def run():
        return population_generate(
            params,
            config,
            basis,
            layout,
            genomes,
            jnp.asarray(tokens),
            jnp.asarray(mask),
            jax.random.key(3),
            max_new_tokens=N,
            greedy=True,
            eos_token_ids=(),
        )

    a, b = _both(run)
    _same(a, b)
    # The members differ from each other (the genomes reach the decode), on both paths.
    per_member = np.asarray(a.tokens).reshape(4, -1)
    assert len({tuple(r) for r in per_member}) > 1
