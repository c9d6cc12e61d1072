"""Shapes of public checkpoints, as their HF `config.json` fields: model shapes without a download.

The ahead-of-time plan (`essa_jax.plan`) compiles a run's programs for a 7B or 32B model on a
machine that holds neither the checkpoint nor the devices; it needs only the architecture's shape.
These are the `config.json` fields that `ModelConfig.from_hf_dict` reads (names as in the
checkpoints' own files; figures from the public model cards: docs/ARCHITECTURE.md, "Planning
memory"). A local `config.json` always wins over this table.
"""

from __future__ import annotations

from typing import Any

from essa_jax.models.config import ModelConfig


def _qwen2(hidden, inter, layers, heads, kv, vocab, tied, theta=1e6, max_pos=32768):
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
        "rope_theta": theta,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": max_pos,
        "eos_token_id": 151643,
    }


def _llama(hidden, inter, layers, heads, kv, vocab, tied, theta, eps, max_pos, rope=None, eos=2):
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
        "rope_theta": theta,
        "rms_norm_eps": eps,
        "max_position_embeddings": max_pos,
        "eos_token_id": eos,
    }
    if rope:
        cfg["rope_scaling"] = rope
    return cfg


_LLAMA31_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

# name -> HF config.json fields. Names are the checkpoints' own (case-insensitive lookup).
MODEL_SHAPES: dict[str, dict[str, Any]] = {
    "SmolLM2-135M": _llama(576, 1536, 30, 9, 3, 49152, True, 1e5, 1e-5, 8192),
    "SmolLM2-360M": _llama(960, 2560, 32, 15, 5, 49152, True, 1e5, 1e-5, 8192),
    "SmolLM2-1.7B": _llama(2048, 8192, 24, 32, 32, 49152, True, 1.3e5, 1e-5, 8192),
    "Qwen2.5-0.5B": _qwen2(896, 4864, 24, 14, 2, 151936, True),
    "Qwen2.5-1.5B": _qwen2(1536, 8960, 28, 12, 2, 151936, True),
    "Qwen2.5-3B": _qwen2(2048, 11008, 36, 16, 2, 151936, True),
    "Qwen2.5-7B": _qwen2(3584, 18944, 28, 28, 4, 152064, False),
    "Qwen2.5-Math-7B": _qwen2(3584, 18944, 28, 28, 4, 152064, False, theta=1e4, max_pos=4096),
    "Qwen2.5-14B": _qwen2(5120, 13824, 48, 40, 8, 152064, False),
    "Qwen2.5-32B": _qwen2(5120, 27648, 64, 40, 8, 152064, False),
    "Llama-3.1-8B": _llama(
        4096, 14336, 32, 32, 8, 128256, False, 5e5, 1e-5, 131072, _LLAMA31_ROPE, 128001
    ),
}
# Instruct / chat variants share their base model's shape.
_ALIASES = {"-instruct": "", "-chat": ""}


def model_shape(name: str) -> ModelConfig:
    """The `ModelConfig` of a public checkpoint by name (e.g. "Qwen2.5-7B-Instruct").

    Raises ValueError naming the known shapes when `name` is not one of them.
    """
    key = name.strip().lower()
    for suffix, repl in _ALIASES.items():
        if key.endswith(suffix):
            key = key[: -len(suffix)] + repl
    table = {k.lower(): v for k, v in MODEL_SHAPES.items()}
    if key not in table:
        raise ValueError(
            f"unknown model shape {name!r}; known: {sorted(MODEL_SHAPES)} (or point model.path "
            "at a directory with the checkpoint's config.json)"
        )
    return ModelConfig.from_hf_dict(table[key])
