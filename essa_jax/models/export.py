"""Our params pytree as a Hugging Face checkpoint: the inverse of `loading.load_hf_dir`.

`hf_state_dict` names every weight as transformers' Llama / Qwen2 / Mistral modules do, in their
`[out, in]` layout (the loader's table, `loading.HF_LAYER_NAMES`, read backwards); `save_hf_dir`
writes a checkpoint directory (the source's config.json, or `hf_config_dict`, and tokenizer
files, the weights as
sharded safetensors with `model.safetensors.index.json`) that `transformers.AutoModelForCausalLM`
and `load_hf_dir` load (tests/models/test_export.py).
"""

from __future__ import annotations

import dataclasses
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


def hf_config_dict(config: ModelConfig, dtype: str = "float32") -> dict[str, Any]:
    """A transformers `config.json` dict of `config` (the inverse of `ModelConfig.from_hf_dict`):
    Qwen2 when the projections have biases, Mistral with a sliding window, else Llama."""
    if config.attention_bias:
        arch, model_type = "Qwen2ForCausalLM", "qwen2"
    elif config.sliding_window is not None:
        arch, model_type = "MistralForCausalLM", "mistral"
    else:
        arch, model_type = "LlamaForCausalLM", "llama"
    eos = list(config.eos_token_ids)
    out: dict[str, Any] = {
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "rope_theta": config.rope_theta,
        "rms_norm_eps": config.rms_norm_eps,
        "tie_word_embeddings": config.tie_embeddings,
        "max_position_embeddings": config.max_position_embeddings,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": eos[0] if len(eos) == 1 else eos or None,
        "pad_token_id": config.pad_token_id,
        "torch_dtype": dtype,
    }
    if model_type == "mistral":
        out["sliding_window"] = config.sliding_window
    if model_type == "qwen2" and config.sliding_window is not None:
        out.update(use_sliding_window=True, sliding_window=config.sliding_window)
    if config.rope_scaling is not None:
        out["rope_scaling"] = dataclasses.asdict(config.rope_scaling)
    return out


def save_hf_dir(
    path: str | Path,
    params: Mapping[str, Any],
    config: ModelConfig,
    *sources: str | Path | None,
    max_shard_bytes: int = 2**30,
) -> list[Path]:
    """Write `params` as a Hugging Face checkpoint in `path`: config.json and the tokenizer files
    of the first `sources` directory holding them (training leaves the architecture as it was;
    without one, config.json is `hf_config_dict`), the weights in the params' dtype as
    safetensors shards of at most `max_shard_bytes` (one tensor may exceed it) with the index
    transformers reads. Returns the files written.
    """
    from safetensors.flax import save_file  # bfloat16 too (numpy cannot)

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    dirs = [Path(s) for s in sources if s and Path(s).is_dir()]
    written = []
    for name in ("config.json", *TOKENIZER_FILES):
        found = [d / name for d in dirs if (d / name).is_file()]
        if found:
            written.append(Path(shutil.copyfile(found[0], path / name)))
    if not (path / "config.json").is_file():
        dtype = str(np.dtype(jax.tree.leaves(params)[0].dtype))
        (path / "config.json").write_text(json.dumps(hf_config_dict(config, dtype), indent=2))
        written.append(path / "config.json")
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
