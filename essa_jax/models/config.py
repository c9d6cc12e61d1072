"""Model configuration for the Llama-family decoders (Llama 2/3, Mistral, Qwen2/2.5, SmolLM2).

`ModelConfig` is frozen and hashable so it can be a `jax.jit` static argument. It is built from a
Hugging Face `config.json` dict (`ModelConfig.from_hf_dict`) or from GGUF metadata (see `loading`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

# Architectures whose weights and maths this package implements (HF `architectures` names).
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
# The per-layer linear projections of a decoder layer, in layer order: attention q, k, v, o, then
# the gated MLP. These names are the LoRA targets too (essa_jax.lora, config.lora.targets).
PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")


def projection_shape(config: Any, name: str) -> tuple[int, int]:
    """(in_features, out_features) of projection `name` in every layer of `config`.

    The one table of projection shapes: `ModelConfig.projection_shape`, LoRA's `target_shape` and
    the checkpoint loaders (whose tensors are stored [out, in]) read it. `config` is a
    `ModelConfig` or any object with `hidden_size, intermediate_size, num_heads, num_kv_heads,
    head_dim`.
    """
    d, i, hd = config.hidden_size, config.intermediate_size, config.head_dim
    q, kv = config.num_heads * hd, config.num_kv_heads * hd
    shapes = {
        "q": (d, q),
        "k": (d, kv),
        "v": (d, kv),
        "o": (q, d),
        "gate": (d, i),
        "up": (d, i),
        "down": (i, d),
    }
    if name not in shapes:
        raise ValueError(f"unknown projection {name!r}; valid projections: {PROJECTIONS}")
    return shapes[name]


class UnsupportedModelError(ValueError):
    """The checkpoint describes a model this package cannot run (architecture, rope type, ...)."""


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling (HF `rope_scaling` / `rope_parameters`).

    rope_type "linear": inv_freq / factor (position interpolation, Chen et al. 2023).
    rope_type "llama3": the piecewise wavelength rule of Llama 3.1 (low / high frequency factors,
    smooth interpolation between them), as in transformers' `_compute_llama3_parameters`.
    """

    rope_type: str
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self):
        if self.rope_type not in ("linear", "llama3"):
            raise UnsupportedModelError(
                f"rope scaling type {self.rope_type!r} is not supported; supported: "
                f"{SUPPORTED_ROPE_TYPES}"
            )


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of a Llama-family decoder-only transformer.

    `num_heads % num_kv_heads == 0` (grouped-query attention, Ainslie et al. 2023; MHA when equal).
    `sliding_window` (Mistral) limits attention to the last `sliding_window` slots; None = full.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    rms_norm_eps: float = 1e-5
    tie_embeddings: bool = False
    attention_bias: bool = False
    max_position_embeddings: int = 4096
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    sliding_window: int | None = None

    def __post_init__(self):
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim must be even for RoPE, got {self.head_dim}")
        if not isinstance(self.eos_token_ids, tuple):
            raise ValueError(
                f"ModelConfig.eos_token_ids must be a tuple (hashable), got {self.eos_token_ids!r}"
            )

    @property
    def effective_pad_id(self) -> int:
        """Token written after EOS and used for padding: pad_token_id, else first EOS, else 0."""
        if self.pad_token_id is not None:
            return self.pad_token_id
        return self.eos_token_ids[0] if self.eos_token_ids else 0

    def projection_shape(self, name: str) -> tuple[int, int]:
        """(in_features, out_features) of projection `name` (one of PROJECTIONS) of every layer."""
        return projection_shape(self, name)

    def projection_shapes(self) -> dict[str, tuple[int, int]]:
        """{name: (in_features, out_features)} of every projection in PROJECTIONS."""
        return {name: projection_shape(self, name) for name in PROJECTIONS}

    def num_params(self) -> int:
        """Number of weights (embedding counted once when tied)."""
        d, hd = self.hidden_size, self.head_dim
        q, kv = self.num_heads * hd, self.num_kv_heads * hd
        kernels = sum(fan_in * fan_out for fan_in, fan_out in self.projection_shapes().values())
        layer = kernels + (q + 2 * kv if self.attention_bias else 0) + 2 * d
        head = 0 if self.tie_embeddings else d * self.vocab_size
        return self.vocab_size * d + self.num_layers * layer + d + head

    @classmethod
    def from_hf_dict(cls, cfg: Mapping[str, Any]) -> ModelConfig:
        """Build from a Hugging Face `config.json` dict (transformers v4 or v5 rope fields)."""
        archs = cfg.get("architectures") or []
        arch = archs[0] if archs else None
        model_type = cfg.get("model_type")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"unsupported architecture {arch!r} (model_type {model_type!r}); supported: "
                f"{SUPPORTED_ARCHITECTURES}"
            )
        num_heads = cfg["num_attention_heads"]
        hidden = cfg["hidden_size"]
        head_dim = cfg.get("head_dim") or hidden // num_heads
        # transformers v5 folds rope_theta / rope_scaling into `rope_parameters`.
        rope = dict(cfg.get("rope_parameters") or {})
        if cfg.get("rope_scaling"):
            rope.update(cfg["rope_scaling"])
        rope_theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
        scaling = None
        if rope_type != "default":
            if rope_type not in SUPPORTED_ROPE_TYPES:
                raise UnsupportedModelError(
                    f"rope scaling type {rope_type!r} is not supported; supported: "
                    f"{SUPPORTED_ROPE_TYPES}"
                )
            scaling = RopeScaling(
                rope_type=rope_type,
                factor=float(rope.get("factor", 1.0)),
                low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
                high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
                original_max_position_embeddings=int(
                    rope.get("original_max_position_embeddings", 8192)
                ),
            )
        eos = cfg.get("eos_token_id")
        eos_ids = () if eos is None else tuple(eos) if isinstance(eos, list | tuple) else (eos,)
        if arch == "Qwen2ForCausalLM":
            attention_bias = True  # Qwen2 always has q/k/v biases (and none on o_proj).
            window = cfg.get("sliding_window") if cfg.get("use_sliding_window") else None
        else:
            attention_bias = bool(cfg.get("attention_bias", False))
            window = cfg.get("sliding_window") if arch == "MistralForCausalLM" else None
        if attention_bias and arch == "LlamaForCausalLM":
            raise UnsupportedModelError(
                "LlamaForCausalLM with attention_bias=True (bias on o_proj too) is not supported"
            )
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=hidden,
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            rope_theta=rope_theta,
            rope_scaling=scaling,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=attention_bias,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
            pad_token_id=cfg.get("pad_token_id"),
            sliding_window=window,
        )
