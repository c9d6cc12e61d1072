"""Loading pretrained weights: Hugging Face directories (config.json + safetensors) and GGUF files.

Only safetensors and GGUF are read: never pickle, never remote code. Weights are converted to this
package's layout (`transformer.py`): `[in, out]` kernels stacked over layers.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import ml_dtypes
import numpy as np

from essa_jax.models.config import (
    PROJECTIONS,
    SUPPORTED_ARCHITECTURES,
    ModelConfig,
    UnsupportedModelError,
)
from essa_jax.models.hub import resolve_name
from essa_jax.models.quant import (
    GGUF_BLOCK,
    GGUF_NATIVE,
    QUANT_MODES,
    gguf_blocks,
    gguf_kernel,
    quantize_params,
    warn_requantised,
)
from essa_jax.models.transformer import Params

# model.path of a tiny random model + char tokenizer (`essa_jax.models.tiny`), for tests.
RANDOM_PREFIX = "random:"


class CheckpointError(ValueError):
    """A checkpoint file is missing, corrupt, or does not match its config (names file/tensor)."""


# ---------------------------------------------------------------------------------------------
# safetensors


_ST_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


class SafetensorsFile:
    """A validated safetensors file, read through a memory map (handles BF16 via ml_dtypes).

    The safetensors library validates the file (header, offsets, coverage); tensors are then viewed
    straight from the mapped bytes, because its numpy API cannot return bfloat16.
    """

    def __init__(self, path: Path):
        from safetensors import SafetensorError, safe_open

        self.path = Path(path)
        try:
            with safe_open(str(self.path), framework="np") as f:
                names = list(f.keys())
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"cannot read safetensors file {self.path}: {e}") from e
        with open(self.path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        header.pop("__metadata__", None)
        self._header = header
        self._offset = 8 + n
        self._data = np.memmap(self.path, dtype=np.uint8, mode="r")
        self.names = names

    def get(self, name: str) -> np.ndarray:
        info = self._header[name]
        if info["dtype"] not in _ST_DTYPES:
            raise CheckpointError(
                f"{self.path}: tensor {name!r} has dtype {info['dtype']}; supported: "
                f"{sorted(_ST_DTYPES)}"
            )
        start, end = info["data_offsets"]
        raw = self._data[self._offset + start : self._offset + end]
        return raw.view(_ST_DTYPES[info["dtype"]]).reshape(info["shape"])


def _open_hf_dir(path: Path) -> dict[str, Callable[[], np.ndarray]]:
    """Map tensor name -> loader for every tensor of the (possibly sharded) checkpoint."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
    else:
        files = sorted(p.name for p in path.glob("*.safetensors"))
        if not files:
            raise CheckpointError(
                f"no *.safetensors files in {path} (pickled .bin checkpoints are not loaded; "
                "convert them to safetensors)"
            )
    tensors: dict[str, Callable[[], np.ndarray]] = {}
    for name in files:
        file_path = path / name
        if not file_path.is_file():
            raise CheckpointError(
                f"checkpoint shard {file_path} (listed in {index.name}) is missing"
            )
        st = SafetensorsFile(file_path)
        for tensor in st.names:
            tensors[tensor] = lambda st=st, tensor=tensor: st.get(tensor)
    return tensors


# HF module name of each projection (transformers' Llama / Qwen2 / Mistral layout; PEFT adapters
# name their tensors after them too, essa_jax.lora.peft_io).
HF_MODULE_NAMES = {
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "o": "self_attn.o_proj",
    "gate": "mlp.gate_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
}
# transformers' tensor names of each per-layer leaf (projections: module names, + .weight / .bias)
# and of the others; `models.export` writes checkpoints with the same tables.
HF_LAYER_NAMES = {
    "attn_norm": "input_layernorm.weight",
    "mlp_norm": "post_attention_layernorm.weight",
    **HF_MODULE_NAMES,
}
HF_TOP_NAMES = {
    "embed": "model.embed_tokens.weight",
    "final_norm": "model.norm.weight",
    "lm_head": "lm_head.weight",
}

_GGUF_LAYER = {
    "attn_norm": "attn_norm.weight",
    "mlp_norm": "ffn_norm.weight",
    "q": "attn_q",
    "k": "attn_k",
    "v": "attn_v",
    "o": "attn_output",
    "gate": "ffn_gate",
    "up": "ffn_up",
    "down": "ffn_down",
}


def _expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Per-layer shapes in the checkpoint's own [out, in] layout (ModelConfig's (in, out) table,
    transposed)."""
    d = config.hidden_size
    shapes: dict[str, tuple[int, ...]] = {"attn_norm": (d,), "mlp_norm": (d,)}
    for name, (fan_in, fan_out) in config.projection_shapes().items():
        shapes[name] = (fan_out, fan_in)
    return shapes


def _assemble(
    config: ModelConfig,
    get: Callable[[str], np.ndarray],
    names: dict[str, str],
    layer_name: Callable[[int, str], str],
    dtype: Any,
    source: str,
    fix_layer: Callable[[str, np.ndarray], np.ndarray] = lambda key, w: w,
    kernels: dict[str, Any] | None = None,
) -> Params:
    """Gather tensors by name into the stacked params pytree, checking every shape. `kernels`:
    projection kernels already built (GGUF blocks as they are): their tensors are not read."""
    c = config
    shapes = _expected_shapes(c)

    def fetch(name: str, shape: tuple[int, ...]) -> np.ndarray:
        w = get(name)
        if tuple(w.shape) != tuple(shape):
            raise CheckpointError(
                f"{source}: tensor {name!r} has shape {tuple(w.shape)}, expected {tuple(shape)} "
                "from the config"
            )
        return np.asarray(w, np.float32)

    def stack(key: str, suffix: str, shape: tuple[int, ...], transpose: bool) -> jnp.ndarray:
        out = []
        for layer in range(c.num_layers):
            w = fix_layer(key + suffix, fetch(layer_name(layer, key) + suffix, shape))
            out.append(w.T if transpose else w)
        return jnp.asarray(np.stack(out), dtype)

    layers: dict[str, Any] = {
        "attn_norm": stack("attn_norm", "", shapes["attn_norm"], False),
        "mlp_norm": stack("mlp_norm", "", shapes["mlp_norm"], False),
    }
    for key in PROJECTIONS:
        if kernels and key in kernels:
            layers[key] = {"kernel": kernels[key]}
        else:
            layers[key] = {"kernel": stack(key, ".weight", shapes[key], True)}
    if c.attention_bias:
        for key in ("q", "k", "v"):
            layers[key]["bias"] = stack(key, ".bias", (shapes[key][0],), False)
    params: Params = {
        "embed": jnp.asarray(fetch(names["embed"], (c.vocab_size, c.hidden_size)), dtype),
        "layers": layers,
        "final_norm": jnp.asarray(fetch(names["final_norm"], (c.hidden_size,)), dtype),
    }
    if not c.tie_embeddings:
        head = fetch(names["lm_head"], (c.vocab_size, c.hidden_size))
        params["lm_head"] = {"kernel": jnp.asarray(head.T, dtype)}
    return params


def load_hf_dir(
    path: str | Path, dtype: Any = jnp.float32, *, quantize: str = "none", quant_group: int = 32
) -> tuple[ModelConfig, Params]:
    """Load a Hugging Face checkpoint directory (config.json + *.safetensors, sharded or not);
    `quantize` = "int8" | "int4" quantises the projections (`models.quant.quantize_params`)."""
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(f"{path} has no config.json")
    config = ModelConfig.from_hf_dict(json.loads(cfg_file.read_text()))
    tensors = _open_hf_dir(path)

    def get(name: str) -> np.ndarray:
        if name not in tensors:
            raise CheckpointError(f"{path}: tensor {name!r} is missing from the checkpoint")
        return tensors[name]()

    params = _assemble(
        config,
        get,
        HF_TOP_NAMES,
        lambda i, key: f"model.layers.{i}.{HF_LAYER_NAMES[key]}",
        dtype,
        str(path),
    )
    return config, quantize_params(params, quantize, quant_group)


# ---------------------------------------------------------------------------------------------
# GGUF

_GGUF_ARCHS = ("llama", "qwen2")


def _gguf_value(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def _undo_llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Invert llama.cpp's q/k row permutation (convert_hf_to_gguf.py `LlamaModel.permute`).

    llama.cpp stores rotary pairs interleaved; HF rotates halves. Same as transformers'
    `reverse_permute_weights`.
    """
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def gguf_config(reader: Any) -> ModelConfig:
    """ModelConfig from GGUF metadata (llama / qwen2 architectures)."""
    arch = _gguf_value(reader, "general.architecture")
    if arch not in _GGUF_ARCHS:
        raise UnsupportedModelError(
            f"unsupported GGUF architecture {arch!r}; supported: {_GGUF_ARCHS} "
            f"(HF equivalents {SUPPORTED_ARCHITECTURES})"
        )

    def meta(key: str, default: Any = None) -> Any:
        value = _gguf_value(reader, f"{arch}.{key}", default)
        if value is None:
            raise CheckpointError(f"GGUF metadata {arch}.{key} is missing")
        return value

    hidden = int(meta("embedding_length"))
    num_heads = int(meta("attention.head_count"))
    tensor_names = {t.name for t in reader.tensors}
    vocab = _gguf_value(reader, f"{arch}.vocab_size")
    if vocab is None:
        vocab = len(_gguf_value(reader, "tokenizer.ggml.tokens"))
    eos = _gguf_value(reader, "tokenizer.ggml.eos_token_id")
    scaling_type = _gguf_value(reader, f"{arch}.rope.scaling.type")
    if scaling_type not in (None, "none"):
        raise UnsupportedModelError(f"GGUF rope scaling type {scaling_type!r} is not supported")
    return ModelConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(meta("feed_forward_length")),
        num_layers=int(meta("block_count")),
        num_heads=num_heads,
        num_kv_heads=int(meta("attention.head_count_kv", num_heads)),
        head_dim=int(meta("rope.dimension_count", hidden // num_heads)),
        rope_theta=float(meta("rope.freq_base", 10000.0)),
        rms_norm_eps=float(meta("attention.layer_norm_rms_epsilon", 1e-6)),
        tie_embeddings="output.weight" not in tensor_names,
        attention_bias="blk.0.attn_q.bias" in tensor_names,
        max_position_embeddings=int(meta("context_length", 4096)),
        bos_token_id=_gguf_value(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=() if eos is None else (int(eos),),
        pad_token_id=_gguf_value(reader, "tokenizer.ggml.padding_token_id"),
    )


_GGUF_FLOAT_TYPES = ("F32", "F16", "BF16", "F64")


def _gguf_native_kernels(
    reader: Any,
    config: ModelConfig,
    mode: str,
    group: int,
    dtype: Any,
    source: str,
) -> dict[str, Any]:
    """The projections whose GGUF blocks are already `mode`'s form (`quant.GGUF_NATIVE`: Q8_0 for
    int8; Q4_0 / Q4_1 for int4 with quant_group 32), as `QuantizedKernel`s read block by block,
    never through a float copy. Other block types warn (once per type) and are left out: the
    caller dequantises and requantises them; float tensors (F32 / F16) are left out silently."""
    if mode == "none":
        return {}
    arch = _gguf_value(reader, "general.architecture")
    by_name = {t.name: t for t in reader.tensors}
    shapes = _expected_shapes(config)
    kernels: dict[str, Any] = {}
    requantised: dict[str, int] = {}
    for key in PROJECTIONS:
        names = [f"blk.{i}.{_GGUF_LAYER[key]}.weight" for i in range(config.num_layers)]
        missing = [n for n in names if n not in by_name]
        if missing:
            raise CheckpointError(f"{source}: tensor {missing[0]!r} is missing from the GGUF file")
        types = {by_name[n].tensor_type.name for n in names}
        native = len(types) == 1 and types <= set(GGUF_NATIVE[mode])
        if not native or (mode == "int4" and group != GGUF_BLOCK):
            for t in types - set(_GGUF_FLOAT_TYPES):
                requantised[t] = requantised.get(t, 0) + sum(
                    by_name[n].tensor_type.name == t for n in names
                )
            continue
        (type_name,) = types
        blocks = []
        for n in names:
            t = by_name[n]
            b = gguf_blocks(t.data, type_name, shapes[key])
            if arch == "llama" and key in ("q", "k"):
                # llama.cpp permutes q / k output rows; blocks run along the input, so the same
                # row permutation applies to the integers, scales and minima alike.
                heads = config.num_heads if key == "q" else config.num_kv_heads
                b = tuple(None if a is None else _undo_llama_cpp_permute(a, heads) for a in b)
            blocks.append(b)
        kernels[key] = gguf_kernel(blocks, type_name, dtype)
    for type_name, count in sorted(requantised.items()):
        warn_requantised(type_name, count, mode, group)
    return kernels


def open_gguf(path: str | Path) -> Any:
    """The `gguf.GGUFReader` of `path`: the header is parsed, tensors are memory-mapped (nothing
    is dequantised). Raises CheckpointError, naming what model.path accepts, when the file is not
    GGUF or is truncated."""
    import gguf

    try:
        return gguf.GGUFReader(str(path))
    except (ValueError, OSError) as e:  # not GGUF, or truncated
        raise CheckpointError(
            f"{path}: not a readable GGUF file ({e}); model.path takes a llama.cpp .gguf file, a "
            "Hugging Face checkpoint directory (config.json + *.safetensors), "
            f"'smollm2-135m-instruct' or '{RANDOM_PREFIX}<preset>'"
        ) from None


def peek_model_config(path: str) -> ModelConfig | None:
    """The ModelConfig of `path` without reading weights: a `random:<preset>` tiny model's, an HF
    directory's config.json, a GGUF file's header (`open_gguf`); None if it needs a full load."""
    if path.startswith(RANDOM_PREFIX):
        from essa_jax.models.tiny import tiny_model_config

        return tiny_model_config(path[len(RANDOM_PREFIX) :])
    if os.path.isdir(path) and os.path.exists(os.path.join(path, "config.json")):
        with open(os.path.join(path, "config.json")) as f:
            return ModelConfig.from_hf_dict(json.load(f))
    resolved = resolve_name(path)
    if resolved.is_file() and resolved.suffix == ".gguf":
        return gguf_config(open_gguf(resolved))
    return None


def load_gguf(
    path: str | Path, dtype: Any = jnp.float32, *, quantize: str = "none", quant_group: int = 32
) -> tuple[ModelConfig, Params]:
    """Load a llama / qwen2 GGUF file, dequantising every tensor to float32 then `dtype`.

    `quantize` = "int8" | "int4": projections stored as Q8_0 (int8) or Q4_0 / Q4_1 (int4, with
    `quant_group` = 32) load as those blocks, without a float copy; other projections are
    dequantised and quantised by `models.quant.quantize_params` (block types with a warning).
    """
    import gguf

    if quantize not in QUANT_MODES:
        raise ValueError(f"quantize={quantize!r}; valid: {QUANT_MODES}")
    path = Path(path)
    reader = open_gguf(path)
    config = gguf_config(reader)
    arch = _gguf_value(reader, "general.architecture")
    by_name = {t.name: t for t in reader.tensors}

    def get(name: str) -> np.ndarray:
        if name not in by_name:
            raise CheckpointError(f"{path}: tensor {name!r} is missing from the GGUF file")
        t = by_name[name]
        # dequantize returns numpy's row-major shape, i.e. the reversed GGML dims = HF [out, in].
        try:
            return gguf.quants.dequantize(t.data, t.tensor_type)
        except (ValueError, NotImplementedError) as e:
            raise CheckpointError(
                f"{path}: tensor {name!r} ({t.tensor_type.name}) cannot be decoded: {e}"
            ) from None

    def fix_layer(key: str, w: np.ndarray) -> np.ndarray:
        if arch != "llama":
            return w
        if key == "q.weight":
            return _undo_llama_cpp_permute(w, config.num_heads)
        if key == "k.weight":
            return _undo_llama_cpp_permute(w, config.num_kv_heads)
        return w

    names = {
        "embed": "token_embd.weight",
        "final_norm": "output_norm.weight",
        "lm_head": "output.weight",
    }
    kernels = _gguf_native_kernels(reader, config, quantize, quant_group, dtype, str(path))
    params = _assemble(
        config,
        get,
        names,
        lambda i, key: f"blk.{i}.{_GGUF_LAYER[key]}",
        dtype,
        str(path),
        fix_layer,
        kernels,
    )
    return config, quantize_params(params, quantize, quant_group)


def quantize_base(
    path_or_name: str | Path,
    params: Params,
    config: ModelConfig,
    quantize: str,
    quant_group: int = 32,
) -> Params:
    """`params` (loaded from `path_or_name` as float) with the projections in `quantize` form:
    a GGUF's Q8_0 / Q4_0 / Q4_1 blocks read again as they are (`load_gguf`), every other kernel
    quantised from `params`. Norms, embedding and head are `params`' own arrays (not copied)."""
    if quantize == "none":
        return params
    path = resolve_name(path_or_name) if isinstance(path_or_name, str) else Path(path_or_name)
    kernels: dict[str, Any] = {}
    if path.is_file() and path.suffix == ".gguf":
        reader = open_gguf(path)
        dtype = params["embed"].dtype
        kernels = _gguf_native_kernels(reader, config, quantize, quant_group, dtype, str(path))
    layers = dict(params["layers"])
    for key, kernel in kernels.items():
        layers[key] = {**layers[key], "kernel": kernel}
    return quantize_params({**params, "layers": layers}, quantize, quant_group)


def load_pretrained(
    path_or_name: str | Path,
    dtype: Any = jnp.float32,
    *,
    quantize: str = "none",
    quant_group: int = 32,
) -> tuple[ModelConfig, Params]:
    """(ModelConfig, params) from an HF directory, a `.gguf` file, or "smollm2-135m-instruct".

    `quantize` = "int8" | "int4" (one scale per `quant_group` input values) stores the seven
    projections quantised (`models.quant`; GGUF Q8_0 / Q4_0 / Q4_1 blocks as they are).

    Raises CheckpointError (missing / corrupt file, missing tensor, shape mismatch) or
    UnsupportedModelError (architecture or rope type this package does not implement).
    """
    path = resolve_name(path_or_name)
    q = dict(quantize=quantize, quant_group=quant_group)
    if path.is_dir():
        return load_hf_dir(path, dtype, **q)
    if path.is_file() and path.suffix == ".gguf":
        return load_gguf(path, dtype, **q)
    if path.is_file():
        raise CheckpointError(
            f"{path}: expected a .gguf file or a Hugging Face directory (config.json + safetensors)"
        )
    raise CheckpointError(
        f"{path_or_name!r} is not a directory, a .gguf file, or a known model name "
        f"(known: 'smollm2-135m-instruct')"
    )
