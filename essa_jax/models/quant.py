"""Weight-only quantisation of the base model's projections: int8 and int4 kernels, GGUF blocks.

ESSA's fitness needs only inference, and inference tolerates quantised weights (ESSA, arXiv
2507.04453, Sec. 5: Qwen2.5-32B on PRM800K, bf16 0.847, int8 0.844, int4 0.838), so the base
weights every candidate reads can be 2-4x smaller than bfloat16 (8x than float32).

Forms (the kernel of projection q, k, v, o, gate, up or down, `[..., in, out]`, contraction over
`in`, stacked layers on the leading axes):

- ``int8``: symmetric absmax with one scale per output channel (qwix's `quantize`,
  `channelwise_axes` = every axis but `in`): w ~= q * s, q in [-127, 127] (qwix rounds onto
  [-128, 127] with bound 127.5), s = max_in |w| / 127.5, so |w - q s| <= s / 2.
- ``int4``: symmetric absmax with one scale per tile of `group` consecutive input values
  (`tiled_axes` = {in: group}; the GPTQ / AWQ tile): q in [-8, 7], s = max_tile |w| / 7.5,
  |w - q s| <= s / 2.
- GGUF blocks as they are (`gguf_kernel`): llama.cpp's Q8_0 (w = d q, q int8), Q4_0
  (w = d (q - 8), q in 0..15) and Q4_1 (w = d q + m) store 32 consecutive input values per
  block, i.e. exactly a tile of 32 along `in`: Q8_0 is an int8 QArray tiled by 32, Q4_0 an int4
  one, Q4_1 a uint4 one plus a per-tile offset m (see `QuantizedKernel`).

Activations, the LoRA / SVD adapters, norms, the embedding / output head and the KV cache stay in
the compute dtype: only the seven projections (about 80% of the weights of SmolLM2-135M, >95% of
a 7B model's) are quantised.

What the compiled program does: `qmatmul` calls `qwix.dot_general` with a float activation and a
quantised kernel, for which qwix takes its "dequantise the operand, then a float dot" path
(`_slow_dot_general`: XLA fuses the dequantisation into the matmul's operand on GPU / TPU, so only
the int8 / int4 bytes are read from memory; XLA's CPU backend materialises the float kernel, one
layer at a time, before calling its dot). The int x int fast path would need the activations
quantised too, which this module does not do (weight-only).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import qwix

from essa_jax.models.config import PROJECTIONS, ModelConfig

QUANT_MODES = ("none", "int8", "int4")
GGUF_BLOCK = 32  # values per Q8_0 / Q4_0 / Q4_1 block (llama.cpp's QK8_0 = QK4_0 = QK4_1)
# GGUF block types that load as they are, by the form they fit without loss.
GGUF_NATIVE = {"int8": ("Q8_0",), "int4": ("Q4_0", "Q4_1")}
_QTYPES = {"int8": jnp.int8, "int4": jnp.int4}


@flax.struct.dataclass
class QuantizedKernel:
    """A quantised projection kernel `[..., in, out]` (w ~= dequantize(qarray) + offset).

    qarray: a `qwix.QArray`: qvalue `[..., in, out]` (int8, int4 or uint4) and scale
        `[..., in / tile, out]` (tile = in: one scale per output channel) in the compute dtype.
    offset: None, or `[..., in / tile, out]` added to every value of its tile: GGUF Q4_1's block
        minimum m (w = d q + m). qwix cannot hold it: its zero point must be an integer of the
        qvalue's dtype (`qarray.validate_qarray`), and Q4_1's m / d is not one, so this wrapper
        carries it beside the QArray (one extra tile-summed matmul in `qmatmul`).

    A pytree (the layer scan slices every leaf like a float kernel); `shape` / `dtype` are the
    float kernel's (dtype: the one it dequantises to).
    """

    qarray: qwix.QArray
    offset: jax.Array | None = None

    shape = property(lambda self: self.qarray.qvalue.shape)
    ndim = property(lambda self: self.qarray.qvalue.ndim)
    dtype = property(lambda self: self.qarray.scale.dtype)

    @property
    def tile(self) -> int:
        """Input values per scale (`in` itself for per-channel scales)."""
        return self.qarray.qvalue.shape[-2] // self.qarray.scale.shape[-2]


def is_quantized(x: Any) -> bool:
    return isinstance(x, QuantizedKernel)


def check_group(config: ModelConfig, group: int) -> None:
    """Raise ValueError naming model.quant_group unless `group` tiles every projection's input."""
    fan_ins = sorted({fan_in for fan_in, _ in config.projection_shapes().values()})
    g = int(np.gcd.reduce(fan_ins))
    if isinstance(group, bool) or not isinstance(group, int) or group < 1 or g % group:
        valid = [t for t in range(1, g + 1) if g % t == 0]
        raise ValueError(
            f"config.model.quant_group = {group!r} is invalid: valid values are {valid} (the "
            f"divisors of every projection's input size {fan_ins}: int4 has one scale per "
            "quant_group input values)"
        )


def quantize_kernel(w: jax.Array, mode: str, group: int = GGUF_BLOCK) -> QuantizedKernel:
    """`w [..., in, out]` (float) -> its `mode` form (module docstring), scales in w's dtype."""
    if mode not in _QTYPES:
        raise ValueError(f"unknown quantisation {mode!r}; valid: {tuple(_QTYPES)}")
    axis = w.ndim - 2
    others = tuple(a for a in range(w.ndim) if a != axis)
    if mode == "int8":
        qa = qwix.quantize(w, jnp.int8, channelwise_axes=others)
    else:
        if w.shape[axis] % group:
            raise ValueError(
                f"config.model.quant_group = {group} does not divide a kernel's input size "
                f"{w.shape[axis]}"
            )
        qa = qwix.quantize(w, jnp.int4, channelwise_axes=others, tiled_axes={axis: group})
    return QuantizedKernel(qa)


def _expand(t: jax.Array, n: int) -> jax.Array:
    """Per-tile values `[..., in / tile, out]` repeated to `[..., in, out]`."""
    return jnp.repeat(t, n // t.shape[-2], axis=-2)


def dequantize_kernel(k: QuantizedKernel) -> jax.Array:
    """The float kernel `[..., in, out]` (in the scale's dtype)."""
    w = qwix.dequantize(k.qarray)
    if k.offset is not None:
        w = w + _expand(k.offset, w.shape[-2]).astype(w.dtype)
    return w


def qmatmul(x: jax.Array, k: QuantizedKernel) -> jax.Array:
    """x `[..., in]` @ kernel `[in, out]` -> `[..., out]` in float32 (float32 accumulation).

    The QArray part goes through `qwix.dot_general` (module docstring: dequantise-then-dot); a
    Q4_1 offset adds sum_t (sum_{i in tile t} x_i) m_t: a matmul `tile` times smaller than the
    kernel's, exact since m is constant over its tile.
    """
    dims = (((x.ndim - 1,), (0,)), ((), ()))
    y = qwix.dot_general(x, k.qarray, dims, preferred_element_type=jnp.float32)
    if k.offset is not None:
        n_in = x.shape[-1]
        tiles = x.reshape(*x.shape[:-1], k.offset.shape[-2], n_in // k.offset.shape[-2])
        sums = jnp.sum(tiles.astype(jnp.float32), axis=-1)
        y = y + jnp.matmul(sums, k.offset.astype(jnp.float32))
    return y


def quantize_params(params: Mapping[str, Any], mode: str, group: int = GGUF_BLOCK) -> dict:
    """params with every projection kernel in `mode` form ("none": params unchanged).

    Kernels already quantised (loaded from GGUF blocks) are kept; every other leaf is shared.
    Pure: works under `jax.eval_shape` on `ShapeDtypeStruct`s (the plan's abstract weights).
    """
    if mode == "none":
        return dict(params)
    layers = params["layers"]
    if isinstance(layers, tuple):
        raise ValueError("quantize_params takes stacked params (before per_layer_params)")
    new_layers = dict(layers)
    for name in PROJECTIONS:
        kernel = layers[name]["kernel"]
        if not is_quantized(kernel):
            new_layers[name] = {**layers[name], "kernel": quantize_kernel(kernel, mode, group)}
    return {**params, "layers": new_layers}


# -- bytes ----------------------------------------------------------------------------------------


def _bits(dtype: Any) -> int:
    dtype = np.dtype(dtype)
    if dtype in (np.dtype(ml_dtypes.int4), np.dtype(ml_dtypes.uint4)):
        return 4  # XLA packs two 4-bit values per byte (numpy's itemsize says 1)
    return 8 * dtype.itemsize


def param_bytes(params: Any) -> int:
    """Resident bytes of a params pytree (arrays or ShapeDtypeStructs), 4-bit values at half a
    byte each as XLA stores them (checked against `memory_analysis` in tests/models/test_quant)."""
    return sum(-(-int(np.prod(x.shape)) * _bits(x.dtype) // 8) for x in jax.tree.leaves(params))


# -- GGUF blocks ----------------------------------------------------------------------------------


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """Q4 block bytes `[rows, blocks, 16]` -> values `[rows, blocks, 32]` in 0..15 (uint8): value
    j of a block is the low nibble of byte j, value 16 + j its high nibble (ggml's layout)."""
    return np.concatenate([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=-1)


def gguf_blocks(
    data: np.ndarray, type_name: str, shape: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Decode the blocks of a Q8_0 / Q4_0 / Q4_1 tensor of numpy shape `shape` = (rows, in).

    data: the tensor's bytes `[rows, in / 32 * block bytes]` (uint8, `GGUFReader` tensor data).
    Returns (q `[rows, in]` int8 (Q8_0, Q4_0: q - 8) or uint8 (Q4_1, 0..15), d `[rows, in / 32]`
    float32, m `[rows, in / 32]` float32 or None), with w = d q (+ m) per block exactly as
    `gguf.quants.dequantize` computes it. No float copy of the weights is made.
    """
    rows, n_in = shape
    if n_in % GGUF_BLOCK:
        raise ValueError(f"a {type_name} row of {n_in} values is not whole blocks of {GGUF_BLOCK}")
    nb = n_in // GGUF_BLOCK
    blocks = np.asarray(data, np.uint8).reshape(rows, nb, -1)
    d = np.ascontiguousarray(blocks[..., 0:2]).view(np.float16)[..., 0].astype(np.float32)
    if type_name == "Q8_0":
        q = np.ascontiguousarray(blocks[..., 2:]).view(np.int8)
        return q.reshape(rows, n_in), d, None
    if type_name == "Q4_0":
        q = (_nibbles(blocks[..., 2:]).astype(np.int8) - np.int8(8)).reshape(rows, n_in)
        return q, d, None
    if type_name == "Q4_1":
        m = np.ascontiguousarray(blocks[..., 2:4]).view(np.float16)[..., 0].astype(np.float32)
        return _nibbles(blocks[..., 4:]).reshape(rows, n_in), d, m
    raise ValueError(f"GGUF block type {type_name} has no quantised form; dequantise it")


def gguf_kernel(
    layers: list[tuple[np.ndarray, np.ndarray, np.ndarray | None]], type_name: str, dtype: Any
) -> QuantizedKernel:
    """Stack per-layer `gguf_blocks` results (checkpoint layout [out, in]) into one kernel
    `[L, in, out]` tiled by 32 along `in`: Q8_0 -> int8, Q4_0 -> int4, Q4_1 -> uint4 + offset."""
    q = np.stack([b[0].T for b in layers])
    d = np.stack([b[1].T for b in layers])
    qtype = {"Q8_0": jnp.int8, "Q4_0": jnp.int4, "Q4_1": jnp.uint4}[type_name]
    qvalue = jnp.asarray(q.astype(qtype))
    qa = qwix.QArray(qvalue, jnp.asarray(d, dtype), None, qtype)
    offset = None
    if layers[0][2] is not None:
        offset = jnp.asarray(np.stack([b[2].T for b in layers]), dtype)
    return QuantizedKernel(qa, offset)


def warn_requantised(type_name: str, count: int, mode: str, group: int) -> None:
    """The warning for GGUF projections whose block type has no `mode` form of its own (or whose
    blocks of 32 are not the tiles asked for): they are dequantised and requantised."""
    form = mode if mode == "int8" else f"int4 tiles of {group}"
    warnings.warn(
        f"{count} GGUF projection tensors are {type_name}, which does not load as {form} as it is "
        f"(as they are: {', '.join(GGUF_NATIVE[mode])}"
        + ("" if mode == "int8" else f" with model.quant_group={GGUF_BLOCK}")
        + f"): dequantised to float32 and requantised to {form}",
        stacklevel=3,
    )
