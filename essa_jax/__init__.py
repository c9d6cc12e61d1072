"""essa_jax: ESSA (CMA-ES over LoRA singular values) and GRPO-family alignment of LLMs in JAX."""

__version__ = "0.1.0"
