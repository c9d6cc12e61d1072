"""Llama-family decoder (Llama 3, Mistral, Qwen2, SmolLM2) in JAX: forward, loading, generation.

Public API (see docs/INTERFACES.md):
    ModelConfig, init_params, forward, hidden_states, lm_head, KVCache, init_cache, prefill,
    generate, generate_jit, Generation, pad_left, sequence_logprobs,
    load_pretrained, load_tokenizer, smollm2_gguf_path, CheckpointError, UnsupportedModelError
"""

from essa_jax.models.config import (
    SUPPORTED_ARCHITECTURES,
    ModelConfig,
    RopeScaling,
    UnsupportedModelError,
)
from essa_jax.models.generate import Generation, generate, generate_jit, pad_left
from essa_jax.models.hub import smollm2_gguf_path
from essa_jax.models.loading import CheckpointError, load_gguf, load_hf_dir, load_pretrained
from essa_jax.models.logprobs import sequence_logprobs
from essa_jax.models.tokenizer import load_tokenizer
from essa_jax.models.transformer import (
    LORA_TARGETS,
    KVCache,
    forward,
    hidden_states,
    init_cache,
    init_params,
    lm_head,
    output_kernel,
    prefill,
)

__all__ = [
    "LORA_TARGETS",
    "SUPPORTED_ARCHITECTURES",
    "CheckpointError",
    "Generation",
    "KVCache",
    "ModelConfig",
    "RopeScaling",
    "UnsupportedModelError",
    "forward",
    "generate",
    "generate_jit",
    "hidden_states",
    "init_cache",
    "init_params",
    "lm_head",
    "load_gguf",
    "load_hf_dir",
    "load_pretrained",
    "load_tokenizer",
    "output_kernel",
    "pad_left",
    "prefill",
    "sequence_logprobs",
    "smollm2_gguf_path",
]
