"""Shared helpers for the population tests: the LoRA tests' tiny models plus an SFT-like basis."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lora"))

from lora_helpers import fwd, rand_tokens, randn, random_lora, tiny_model  # noqa: E402

from essa_jax.lora import LoraConfig, svd_factorize  # noqa: E402

__all__ = ["fwd", "rand_tokens", "randn", "random_lora", "tiny_model", "setup"]


def setup(
    name: str = "llama", rank: int = 4, alpha_frac: float = 1.0, targets=("q", "k", "v", "o")
):
    """(config, params, sft_lora, basis, layout) for a tiny random model."""
    config, params = tiny_model(name)
    sft = random_lora(11, config, LoraConfig(rank=rank, alpha=2.0 * rank, targets=targets))
    basis, layout = svd_factorize(sft, alpha_frac)
    return config, params, sft, basis, layout


def left_padded(seed: int, shape, vocab: int):
    """Random tokens [..., B, T] with random left padding (>= 1 real token per row)."""
    import numpy as np

    tokens = rand_tokens(seed, shape, vocab)
    rng = np.random.default_rng(seed + 1)
    lengths = rng.integers(1, shape[-1] + 1, shape[:-1])
    mask = (np.arange(shape[-1]) >= shape[-1] - lengths[..., None]).astype(np.int32)
    return np.where(mask == 1, tokens, 0).astype(np.int32), mask
