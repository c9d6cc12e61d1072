"""Our params pytree as a Hugging Face checkpoint: the inverse of `loading.load_hf_dir`.

`hf_state_dict` names every weight as transformers' Llama / Qwen2 / Mistral modules do, in their
`[out, in]` layout (the loader's table, `loading.HF_LAYER_NAMES`, read backwards); `save_hf_dir`
writes a checkpoint directory (the source's config.json and tokenizer files, the weights as
sharded safetensors with `model.safetensors.index.json`) that `transformers.AutoModelForCausalLM`
and `load_hf_dir` load (tests/models/test_export.py).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from essa_jax.models.config import PROJECTIONS, ModelConfig
from essa_jax.models.loading import HF_LAYER_NAMES, HF_TOP_NAMES
from essa_jax.models.quant import QuantizedKernel

# The tokenizer files of a Hugging Face checkpoint (those present are copied beside the weights).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "generation_config.json",
    "chat_template.jinja",
)


def hf_state_dict(params: Mapping[str, Any], config: ModelConfig) -> dict[str, np.ndarray]:
    """{transformers tensor name: array} of a params pytree (float leaves, any dtype, kept).

    Kernels `[L, in, out]` become per-layer `[out, in]` weights; a tied model has no lm_head
    tensor (transformers ties it to the embedding). Works on a gradient pytree too (the
    parity tests name our gradients this way). Quantised kernels are refused (export the float
    weights).
    """
    host = jax.device_get(params)
    for leaf in jax.tree.leaves(host, is_leaf=lambda x: isinstance(x, QuantizedKernel)):
        if isinstance(leaf, QuantizedKernel):
            raise ValueError("hf_state_dict needs float weights, not quantised kernels")
    out: dict[str, np.ndarray] = {HF_TOP_NAMES["embed"]: np.asarray(host["embed"])}
    layers = host["layers"]
    for i in range(config.num_layers):
        for key, name in HF_LAYER_NAMES.items():
            prefix = f"model.layers.{i}.{name}"
            if key in PROJECTIONS:
                out[f"{prefix}.weight"] = np.ascontiguousarray(
                    np.asarray(layers[key]["kernel"][i]).T
                )
                if "bias" in layers[key]:
                    out[f"{prefix}.bias"] = np.asarray(layers[key]["bias"][i])
            else:
                out[prefix] = np.asarray(layers[key][i])
    out[HF_TOP_NAMES["final_norm"]] = np.asarray(host["final_norm"])
    if "lm_head" in host:
        out[HF_TOP_NAMES["lm_head"]] = np.ascontiguousarray(np.asarray(host["lm_head"]["kernel"]).T)
    return out


def save_hf_dir(
    path: str | Path,
    params: Mapping[str, Any],
    config: ModelConfig,
    source_dir: str | Path,
    *,
    max_shard_bytes: int = 2**30,
) -> list[Path]:
    """Write `params` as a Hugging Face checkpoint in `path`: `source_dir`'s config.json (the
    architecture is unchanged by training) and tokenizer files, the weights in the params' dtype
    as safetensors shards of at most `max_shard_bytes` (one tensor may exceed it) with the index
    transformers reads. Returns the files written.

    Raises ValueError when `source_dir` has no config.json (a GGUF source: export from its
    Hugging Face directory).
    """
    from safetensors.flax import save_file  # bfloat16 too (numpy cannot)

    source, path = Path(source_dir), Path(path)
    if not (source / "config.json").is_file():
        raise ValueError(f"{source} has no config.json to export the architecture from")
    path.mkdir(parents=True, exist_ok=True)
    written = []
    for name in ("config.json", *TOKENIZER_FILES):
        if (source / name).is_file():
            written.append(Path(shutil.copyfile(source / name, path / name)))
    tensors = hf_state_dict(params, config)
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, w in tensors.items():
        if shards[-1] and size + w.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = w
        size += w.nbytes
    n = len(shards)
    weight_map = {}
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        save_file({k: jax.numpy.asarray(v) for k, v in shard.items()}, str(path / file))
        weight_map.update({k: file for k in shard})
        written.append(path / file)
    index = {
        "metadata": {"total_size": int(sum(w.nbytes for w in tensors.values()))},
        "weight_map": weight_map,
    }
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    written.append(path / "model.safetensors.index.json")
    return written
