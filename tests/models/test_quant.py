"""Quantised base weights (essa_jax.models.quant): the int8 / int4 forms against a NumPy reference,
GGUF blocks against the gguf package, the quantised model against float32, and the population
engine and QLoRA gradients on a quantised base."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from essa_jax.models import forward, generate_jit, quantize_params
from essa_jax.models.quant import (
    QuantizedKernel,
    check_group,
    dequantize_kernel,
    gguf_blocks,
    gguf_kernel,
    param_bytes,
    qmatmul,
    quantize_kernel,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "population"))
from pop_helpers import left_padded, randn, setup  # noqa: E402

# qwix's symmetric bound: the largest magnitude maps to qmax + 0.5 (int8: 127.5, int4: 7.5).
BOUND = {"int8": 127.5, "int4": 7.5}
QMIN_QMAX = {"int8": (-128, 127), "int4": (-8, 7)}


def numpy_reference(w: np.ndarray, mode: str, tile: int):
    """(dequantised w, scale per value) of symmetric absmax quantisation, tiles along axis -2."""
    *lead, n_in, n_out = w.shape
    t = w.reshape(*lead, n_in // tile, tile, n_out)
    scale = np.abs(t).max(axis=-2, keepdims=True) / BOUND[mode]
    lo, hi = QMIN_QMAX[mode]
    q = np.clip(np.round(t / scale), lo, hi)
    full = np.broadcast_to(scale, t.shape)
    return (q * scale).reshape(w.shape), full.reshape(w.shape)


@pytest.mark.parametrize(
    "mode,shape,group",
    [
        ("int8", (3, 33, 7), None),
        ("int8", (2, 64, 5), None),
        ("int4", (3, 96, 7), 32),
        ("int4", (2, 96, 7), 48),
        ("int4", (1, 40, 3), 8),
        ("int4", (2, 21, 5), 7),
    ],
)
def test_dequantised_within_bound_of_numpy_reference(mode, shape, group):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal(shape) * rng.uniform(0.1, 3.0, shape[-1])).astype(np.float32)
    k = quantize_kernel(jnp.asarray(w), mode, group or 32)
    tile = shape[-2] if mode == "int8" else group
    assert k.shape == w.shape and k.tile == tile and k.dtype == jnp.float32
    assert k.qarray.qvalue.dtype == {"int8": jnp.int8, "int4": jnp.int4}[mode]
    got = np.asarray(dequantize_kernel(k))
    want, scale = numpy_reference(w, mode, tile)
    # The format's bound: every value within half a step of its tile's scale.
    assert np.all(np.abs(got - w) <= scale / 2 * (1 + 1e-5))
    # And the reference's values, except at rounding ties (each tile's absmax sits at exactly
    # qmax + 0.5 steps: qwix rounds it to qmax, NumPy's half-to-even may give -qmax - 1).
    close = np.isclose(got, want, rtol=0, atol=1e-6 * np.abs(w).max())
    tie = np.abs(np.abs(w / scale) % 1 - 0.5) < 1e-3
    assert np.all(close | tie) and close.mean() > 0.9


def test_group_must_tile_every_projection_input():
    from essa_jax.models.tiny import tiny_model_config

    config = tiny_model_config("tiny")  # inputs 32 (q k v o gate up) and 64 (down)
    check_group(config, 32)
    with pytest.raises(ValueError, match=r"quant_group = 48 .* valid values are \[1, 2, 4, 8, 16"):
        check_group(config, 48)
    with pytest.raises(ValueError, match="does not divide"):
        quantize_kernel(jnp.ones((2, 30, 4)), "int4", 32)


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_0", "Q4_1"])
def test_gguf_blocks_equal_gguf_dequantisation(type_name):
    """Blocks read as they are (integers, scales, Q4_1 minima) dequantise to exactly what the gguf
    package decodes, and multiply like it."""
    import gguf

    rng = np.random.default_rng(1)
    qtype = gguf.GGMLQuantizationType[type_name]
    rows, n_in = 24, 96  # numpy [out, in], three blocks of 32 per row
    layers = []
    want = []
    for layer in range(2):
        w = (rng.standard_normal((rows, n_in)) * (1 + layer)).astype(np.float32)
        data = gguf.quants.quantize(w, qtype)
        layers.append(gguf_blocks(data, type_name, (rows, n_in)))
        want.append(gguf.quants.dequantize(data, qtype).T)  # our [in, out] layout
    k = gguf_kernel(layers, type_name, jnp.float32)
    assert k.shape == (2, n_in, rows) and k.tile == 32
    assert (k.offset is not None) == (type_name == "Q4_1")
    want = np.stack(want)
    # Same products of the same float32 factors (XLA may fuse d * q + m into one FMA: 1 ulp).
    np.testing.assert_allclose(np.asarray(dequantize_kernel(k)), want, rtol=1e-6, atol=1e-7)
    x = rng.standard_normal((5, n_in)).astype(np.float32)
    np.testing.assert_allclose(
        np.asarray(qmatmul(jnp.asarray(x), jax.tree.map(lambda a: a[1], k))),
        x @ want[1],
        rtol=1e-5,
        atol=1e-4,
    )


def test_embedded_smollm2_q4_1_block_equals_gguf(smollm2_gguf_path):
    import gguf

    reader = gguf.GGUFReader(str(smollm2_gguf_path))
    t = next(t for t in reader.tensors if t.name == "blk.3.ffn_down.weight")
    assert t.tensor_type.name == "Q4_1"
    rows, n_in = int(t.shape[1]), int(t.shape[0])
    k = gguf_kernel([gguf_blocks(t.data, "Q4_1", (rows, n_in))], "Q4_1", jnp.float32)
    want = gguf.quants.dequantize(t.data, t.tensor_type).T
    np.testing.assert_allclose(np.asarray(dequantize_kernel(k))[0], want, rtol=1e-6, atol=1e-7)


def test_param_bytes_are_what_xla_holds():
    """int4 values are packed two per byte: the bytes we report are the program's argument
    bytes."""
    w = jnp.asarray(np.random.default_rng(2).standard_normal((2, 64, 48)), jnp.float32)
    for mode, expect in (
        ("int8", 2 * 64 * 48 + 2 * 48 * 4),
        ("int4", 2 * 64 * 48 // 2 + 2 * 2 * 48 * 4),
    ):
        k = quantize_kernel(w, mode, 32)
        assert param_bytes(k) == expect
        held = jax.jit(dequantize_kernel).lower(k).compile().memory_analysis()
        assert held.argument_size_in_bytes == expect
    assert param_bytes(w) == w.size * 4


@pytest.fixture(scope="module")
def tiny():
    return setup("llama", rank=3, targets=("q", "k", "v", "o", "gate", "up", "down"))


def dequantised(qparams):
    """The float params whose kernels are the quantised ones' values."""
    layers = {
        n: ({**p, "kernel": dequantize_kernel(p["kernel"])} if isinstance(p, dict) else p)
        for n, p in qparams["layers"].items()
    }
    return {**qparams, "layers": layers}


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_quantised_model_is_the_model_of_its_dequantised_weights(tiny, mode):
    """forward on int8 / int4 kernels == forward on their dequantised float values (the program
    computes the dequantised model, nothing else), and stays near the float32 model."""
    config, params, sft, _, _ = tiny
    q = quantize_params(params, mode, 16)
    assert all(isinstance(q["layers"][n]["kernel"], QuantizedKernel) for n in ("q", "down"))
    tokens, mask = left_padded(3, (2, 7), config.vocab_size)
    fwd = jax.jit(forward, static_argnames="config")
    got = fwd(q, config, tokens, attention_mask=mask, lora=sft)
    want = fwd(dequantised(q), config, tokens, attention_mask=mask, lora=sft)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)
    f32 = np.asarray(fwd(params, config, tokens, attention_mask=mask, lora=sft))
    # Gaussian weights: relative weight error ~0.5% (int8) and ~8% (int4 by 16: absmax / 7.5
    # steps); this random model's near-zero logits make the int4 logit error ~30% (a loose sanity
    # bound: the real model's is asserted in test_smollm2_quantised_logits_close_to_float32).
    rel = np.linalg.norm(np.asarray(got) - f32) / np.linalg.norm(f32)
    assert 0 < rel < {"int8": 0.02, "int4": 0.5}[mode]


def test_population_on_quantised_base_equals_member_adapter_alone(tiny):
    """Row block i of the population program on an int4 base == `generate` on the same int4
    base with member i's adapter (and its logits == member i merged into the dequantised W)."""
    from essa_jax.lora import merge_lora, svd_lora_to_lora
    from essa_jax.population import population_forward, population_generate

    config, params, _, basis, layout = tiny
    q = quantize_params(params, "int4", 16)
    genomes = 0.3 * randn(4, (3, layout.size))
    tokens, mask = left_padded(5, (2, 5), config.vocab_size)
    settings = dict(max_new_tokens=5, greedy=True, eos_token_ids=())
    key = jax.random.key(0)
    got = population_generate(q, config, basis, layout, genomes, tokens, mask, key, **settings)
    logits = population_forward(q, config, basis, layout, genomes, np.stack([tokens] * 3), mask)
    floats = dequantised(q)
    for i in range(3):
        member = svd_lora_to_lora(basis, layout, jnp.asarray(genomes[i]))
        want = generate_jit(q, config, tokens, mask, key, lora=member, **settings)
        np.testing.assert_array_equal(np.asarray(got.tokens)[i], np.asarray(want.tokens))
        np.testing.assert_allclose(
            np.asarray(got.logprobs)[i], np.asarray(want.logprobs), atol=1e-4
        )
        merged = forward(merge_lora(floats, member), config, tokens, attention_mask=mask)
        real = mask.astype(bool)
        np.testing.assert_allclose(np.asarray(logits[i])[real], np.asarray(merged)[real], atol=3e-5)
    assert not np.array_equal(np.asarray(got.tokens)[0], np.asarray(got.tokens)[1])


def test_qlora_gradient_is_the_dequantised_models(tiny):
    """GRPO / SFT on a quantised base (QLoRA-style): the adapter's gradient through the int8
    kernels is the gradient on their dequantised float values; none reaches the frozen base."""
    from essa_jax.models import sequence_logprobs

    config, params, sft, _, _ = tiny
    q = quantize_params(params, "int8")
    tokens, mask = left_padded(6, (2, 6), config.vocab_size)

    def loss(lora, base):
        return jnp.sum(sequence_logprobs(base, config, tokens, mask, lora=lora)[0] * mask[:, 1:])

    g_q = jax.jit(jax.grad(loss))(sft, q)
    g_f = jax.jit(jax.grad(loss))(sft, dequantised(q))
    for a, b in zip(jax.tree.leaves(g_q), jax.tree.leaves(g_f), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    assert any(np.abs(np.asarray(a)).max() > 0 for a in jax.tree.leaves(g_q))


def test_tensor_parallel_quantised_base():
    """Quantised kernels placed over a model axis (mesh.place_params: integers and tiles split as
    the float kernel, per-channel scales of row-parallel kernels whole) compute the same logits."""
    from essa_jax.mesh import make_mesh, param_specs, place_params
    from essa_jax.models.tiny import tiny_model

    if len(jax.devices()) < 4:
        pytest.skip("needs 4 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    config, params = tiny_model("tp", 0, jnp.float32)
    tokens = jnp.asarray(np.random.default_rng(7).integers(3, config.vocab_size, (2, 5)))
    fwd = jax.jit(forward, static_argnames="config")
    for mode in ("int8", "int4"):
        q = quantize_params(params, mode, 16)
        specs = param_specs(q, config, 4)
        assert specs["layers"]["o"]["kernel"].qarray.qvalue == jax.sharding.PartitionSpec(
            None, "model", None
        )
        want = fwd(q, config, tokens)
        placed = place_params(q, make_mesh(pop=1, data=2, model=4), config)
        np.testing.assert_allclose(
            np.asarray(fwd(placed, config, tokens)), np.asarray(want), atol=1e-5
        )


def test_smollm2_quantised_logits_close_to_float32(smollm2_gguf_path):
    """The embedded SmolLM2 (Q4_1 projections): int4 reads its blocks as they are, so int4 is the
    float32 model to float rounding; int8 requantises them per output channel (bound below)."""
    import warnings

    from essa_jax.models import load_pretrained, quantize_base

    config, params = load_pretrained(smollm2_gguf_path)
    tokens = jnp.asarray([[1, 9690, 198, 2683, 314, 216, 35, 33, 1232, 216, 34, 32, 47, 2]])
    fwd = jax.jit(forward, static_argnames="config")
    f32 = np.asarray(fwd(params, config, tokens))
    int4 = quantize_base(smollm2_gguf_path, params, config, "int4", 32)
    assert int4["layers"]["q"]["kernel"].qarray.qtype == jnp.uint4  # Q4_1 blocks, no float copy
    got4 = np.asarray(fwd(int4, config, tokens))
    # Same weights, summed in another order: float32 rounding of ~1e3 products per logit.
    assert np.abs(got4 - f32).max() < 1e-3 * np.abs(f32).max()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        int8 = quantize_base(smollm2_gguf_path, params, config, "int8", 32)
    assert any("Q4_1" in str(w.message) for w in caught)
    got8 = np.asarray(fwd(int8, config, tokens))
    # Per-channel int8 error is <= scale / 2 = max|w_col| / 255 per weight; SmolLM2's columns
    # have outliers (max|w| ~5 against a typical |w| ~0.05), so the bound is loose in relative
    # terms: asserted is what a greedy decoder needs, the same next token almost everywhere and
    # logits within 10% of their range.
    assert (got8.argmax(-1) == f32.argmax(-1)).mean() >= 0.9
    assert np.abs(got8 - f32).max() < 0.1 * np.abs(f32).max()
    assert (
        param_bytes(int4["layers"])
        < param_bytes(int8["layers"])
        < param_bytes(params["layers"]) / 3
    )


def test_bf16_scales_follow_compute_dtype():
    k = quantize_kernel(jnp.ones((1, 32, 4), jnp.bfloat16), "int8")
    assert k.dtype == jnp.bfloat16 and ml_dtypes.bfloat16 == np.dtype(k.qarray.scale.dtype)
