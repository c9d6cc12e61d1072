"""Fixtures for the model tests: tiny Hugging Face reference models (torch CPU, float32)."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

from essa_jax.models import forward


def save_tiny_hf(
    path: Path,
    arch: str,
    *,
    heads: int = 4,
    kv_heads: int = 2,
    tied: bool = False,
    rope_scaling: dict | None = None,
    seed: int = 0,
    vocab: int = 96,
    layers: int = 2,
):
    """Save a random tiny `arch` (llama | qwen2 | mistral) with save_pretrained; return it."""
    import torch
    import transformers as tf

    kw = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=112,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        tie_word_embeddings=tied,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        rope_theta=5000.0,
    )
    if rope_scaling is not None:
        kw["rope_scaling"] = rope_scaling
    cfg_cls, model_cls = {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM),
    }[arch]
    torch.manual_seed(seed)
    model = model_cls(cfg_cls(**kw)).float().eval()
    with torch.no_grad():
        # Non-trivial norms and biases so that their loading is actually checked.
        for name, prm in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                prm.add_(0.2 * torch.randn_like(prm))
    model.save_pretrained(path, safe_serialization=True)
    return model


def hf_logits(model, tokens: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    import torch

    with torch.no_grad():
        t = torch.as_tensor(np.asarray(tokens), dtype=torch.long)
        m = None if mask is None else torch.as_tensor(np.asarray(mask), dtype=torch.long)
        return model(input_ids=t, attention_mask=m).logits.float().numpy()


@pytest.fixture(scope="session")
def save_hf():
    """`save_tiny_hf(path, arch, **kw) -> torch model` (also written to `path`)."""
    return save_tiny_hf


@pytest.fixture(scope="session")
def ref_logits():
    """`hf_logits(model, tokens, mask=None) -> np.ndarray [B, T, V]`."""
    return hf_logits


@pytest.fixture(scope="session")
def fwd():
    """`forward` under jit (config static): eager scan is slow to dispatch."""
    return jax.jit(forward, static_argnums=1)


@pytest.fixture(scope="session")
def tiny_model():
    """A random tiny GQA model (init_params) with eos id 3 and pad id 0."""
    from essa_jax.models import ModelConfig, init_params

    config = ModelConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        rope_theta=10000.0,
        eos_token_ids=(3,),
        pad_token_id=0,
    )
    # Larger weights than init_params' default make the distributions peaked and the greedy
    # choices robust to float reordering between batched and single-row runs.
    params = jax.tree.map(
        lambda x: x * 4.0, jax.jit(init_params, static_argnums=1)(jax.random.key(0), config)
    )
    return config, params
