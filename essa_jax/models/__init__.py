"""Llama-family decoder (Llama 3, Mistral, Qwen2, SmolLM2) in JAX: forward, loading, generation.

Public API:
    ModelConfig, PROJECTIONS, projection_shape, init_params, forward, hidden_states, lm_head,
    KVCache, init_cache, prefill, generate, generate_jit, Generation, pad_left, sequence_logprobs,
    load_pretrained, load_tokenizer, decode_completions, smollm2_gguf_path, CheckpointError,
    QUANT_MODES, QuantizedKernel, quantize_params, quantize_base (int8 / int4 weights, quant.py),
    UnsupportedModelError,
    tiny_model, tiny_model_config, TINY_PRESETS, CharTokenizer (the "random:<preset>" backend)
"""

from essa_jax.models.config import (
    PROJECTIONS,
    SUPPORTED_ARCHITECTURES,
    ModelConfig,
    RopeScaling,
    UnsupportedModelError,
    projection_shape,
)
from essa_jax.models.generate import Generation, generate, generate_jit, pad_left
from essa_jax.models.hub import smollm2_gguf_path
from essa_jax.models.loading import (
    CheckpointError,
    load_gguf,
    load_hf_dir,
    load_pretrained,
    quantize_base,
)
from essa_jax.models.logprobs import sequence_logprobs
from essa_jax.models.quant import QUANT_MODES, QuantizedKernel, quantize_params
from essa_jax.models.tiny import TINY_PRESETS, CharTokenizer, tiny_model, tiny_model_config
from essa_jax.models.tokenizer import decode_completions, load_tokenizer
from essa_jax.models.transformer import (
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
    "PROJECTIONS",
    "QUANT_MODES",
    "SUPPORTED_ARCHITECTURES",
    "TINY_PRESETS",
    "CharTokenizer",
    "CheckpointError",
    "Generation",
    "KVCache",
    "ModelConfig",
    "QuantizedKernel",
    "RopeScaling",
    "UnsupportedModelError",
    "decode_completions",
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
    "projection_shape",
    "quantize_base",
    "quantize_params",
    "sequence_logprobs",
    "smollm2_gguf_path",
    "tiny_model",
    "tiny_model_config",
]
