"""Logits parity against transformers (torch CPU, float32) on tiny random checkpoints."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from essa_jax.models import ModelConfig, RopeScaling, load_pretrained

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}

CASES = {
    "llama_untied_llama3_rope": dict(arch="llama", heads=4, kv_heads=2, rope_scaling=LLAMA3_ROPE),
    "qwen2_bias_tied": dict(arch="qwen2", heads=4, kv_heads=2, tied=True),
    "llama_mha_4_4": dict(arch="llama", heads=4, kv_heads=4, tied=True),
    "llama_mqa_4_1": dict(arch="llama", heads=4, kv_heads=1),
    "mistral_2_1": dict(arch="mistral", heads=2, kv_heads=1),
}


@pytest.fixture(scope="module", params=list(CASES))
def tiny(request, tmp_path_factory, save_hf):
    path = tmp_path_factory.mktemp(request.param)
    model = save_hf(path, **CASES[request.param])
    config, params = load_pretrained(path)
    return request.param, model, config, params


def test_config_fields(tiny):
    name, model, config, _ = tiny
    hf = model.config
    assert config.num_heads == hf.num_attention_heads
    assert config.num_kv_heads == hf.num_key_value_heads
    assert config.tie_embeddings == hf.tie_word_embeddings
    assert config.attention_bias == name.startswith("qwen2")
    assert config.eos_token_ids == (2,)
    if name == "llama_untied_llama3_rope":
        assert config.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 32)


def _padded_batch(vocab, lengths, T, seed):
    rng = np.random.default_rng(seed)
    tokens = np.zeros((len(lengths), T), np.int32)
    mask = np.zeros((len(lengths), T), np.int32)
    rows = [rng.integers(3, vocab, n) for n in lengths]
    for i, r in enumerate(rows):
        tokens[i, T - len(r) :], mask[i, T - len(r) :] = r, 1
    return rows, tokens, mask


# One shape for every call below: each new shape is a compile, which dominates test time here.
SHAPE = (3, 24)


def test_logits_match_transformers(tiny, fwd, ref_logits):
    _, model, config, params = tiny
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, SHAPE)
    ours = np.asarray(fwd(params, config, tokens, attention_mask=np.ones(SHAPE, np.int32)))
    np.testing.assert_allclose(ours, ref_logits(model, tokens), atol=1e-4, rtol=0)


def test_left_padded_batch_matches_unpadded_rows(tiny, fwd, ref_logits):
    """Each row of a left-padded batch gives the logits of that prompt run alone, unpadded."""
    _, model, config, params = tiny
    rows, tokens, mask = _padded_batch(config.vocab_size, [9, 24, 13], SHAPE[1], seed=1)
    batched = np.asarray(fwd(params, config, tokens, attention_mask=mask))
    for i, r in enumerate(rows):
        alone = ref_logits(model, r[None])[0]  # equals ours unpadded: see the test above
        np.testing.assert_allclose(batched[i, SHAPE[1] - len(r) :], alone, atol=1e-4, rtol=0)
    # HF's own left-padded batch agrees too (positions = cumsum(mask) - 1 in both).
    ref = ref_logits(model, tokens, mask)
    np.testing.assert_allclose(batched * mask[..., None], ref * mask[..., None], atol=1e-4, rtol=0)


def test_bf16_params_close_to_f32(tiny_model, fwd):
    config, params = tiny_model
    tokens = jnp.arange(72).reshape(SHAPE) % config.vocab_size
    ones = jnp.ones(SHAPE, jnp.int32)
    f32 = fwd(params, config, tokens, attention_mask=ones)
    bf16 = fwd(
        jax.tree.map(lambda x: x.astype(jnp.bfloat16), params), config, tokens, attention_mask=ones
    )
    assert bf16.dtype == jnp.float32
    err = float(jnp.max(jnp.abs(bf16 - f32)))
    assert 0 < err < 0.1 * float(jnp.max(jnp.abs(f32)))  # bf16 keeps ~3 digits


def test_config_is_hashable_static_arg():
    c = ModelConfig(
        vocab_size=8,
        hidden_size=8,
        intermediate_size=8,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=4,
        rope_scaling=RopeScaling("llama3", 8.0),
    )
    assert hash(c) == hash(ModelConfig(**{f: getattr(c, f) for f in c.__dataclass_fields__}))
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        ModelConfig(
            vocab_size=8,
            hidden_size=8,
            intermediate_size=8,
            num_layers=1,
            num_heads=3,
            num_kv_heads=2,
            head_dim=4,
        )
