"""A tiny random model and a character tokenizer: the `model.path = "random:<preset>"` backend.

Tests run every pipeline end to end on these in seconds, with no hub and no checkpoint on disk.
`essa_jax.config` reads `TINY_PRESETS` / `tiny_model_config` to validate a "random:<preset>" path.
The tokenizer knows ChatML (`<|im_start|>`, `<|im_end|>`), like SmolLM2's, so prompts render the
same way as with the real model.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from essa_jax.models.config import ModelConfig
from essa_jax.models.transformer import init_params

SPECIAL_TOKENS = ("<pad>", "<|im_start|>", "<|im_end|>")
_CHARS = string.printable[:95] + "\n"  # digits, letters, punctuation, space, newline
CHAR_VOCAB = len(SPECIAL_TOKENS) + len(_CHARS)  # 99

# name -> (hidden, intermediate, layers, heads, kv_heads, head_dim[, attention_bias])
TINY_PRESETS = {
    "tiny": (32, 64, 2, 4, 2, 8),
    "small": (64, 128, 4, 4, 2, 16),
    # Grouped-query attention with q/k/v biases (Qwen2-like) whose heads (16 / 8 KV), MLP columns
    # and vocabulary every model axis of 1, 2, 4 or 8 devices divides: the tensor-parallel tests'.
    "tp": (32, 64, 2, 16, 8, 2, True),
}


def tiny_model_config(preset: str) -> ModelConfig:
    """ModelConfig of a preset (vocab = the char tokenizer's, padded to 128)."""
    if preset not in TINY_PRESETS:
        raise ValueError(f"unknown tiny preset {preset!r}; valid presets: {sorted(TINY_PRESETS)}")
    d, i, n_layers, heads, kv, hd, *bias = TINY_PRESETS[preset]
    return ModelConfig(
        vocab_size=128,
        hidden_size=d,
        intermediate_size=i,
        num_layers=n_layers,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=hd,
        rope_theta=10000.0,
        tie_embeddings=True,
        attention_bias=bool(bias and bias[0]),
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_ids=(2,),
        pad_token_id=0,
    )


def tiny_model(preset: str, seed: int = 0, dtype: Any = jnp.float32) -> tuple[ModelConfig, dict]:
    """(ModelConfig, random params) of a preset; same seed, same weights."""
    config = tiny_model_config(preset)
    return config, init_params(jax.random.PRNGKey(seed), config, dtype)


class CharTokenizer:
    """One token per character (ids 3..98) plus ChatML specials (ids 0..2).

    Duck-types the parts of a Hugging Face tokenizer the pipelines use: `encode`, `decode`,
    `apply_chat_template`, `eos_token_id`, `pad_token_id`, `bos_token_id`.
    """

    pad_token_id = 0
    bos_token_id = 1
    eos_token_id = 2
    vocab_size = CHAR_VOCAB
    _special = re.compile("(" + "|".join(re.escape(s) for s in SPECIAL_TOKENS) + ")")

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        del add_special_tokens  # no BOS is prepended, as with SmolLM2's tokenizer
        ids: list[int] = []
        for piece in self._special.split(text):
            if piece in SPECIAL_TOKENS:
                ids.append(SPECIAL_TOKENS.index(piece))
                continue
            for ch in piece:
                j = _CHARS.find(ch)
                ids.append(len(SPECIAL_TOKENS) + (j if j >= 0 else _CHARS.index("?")))
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        out = []
        for i in ids:
            i = int(i)
            if i < len(SPECIAL_TOKENS):
                if not skip_special_tokens:
                    out.append(SPECIAL_TOKENS[i])
            elif i < CHAR_VOCAB:
                out.append(_CHARS[i - len(SPECIAL_TOKENS)])
        return "".join(out)

    def apply_chat_template(
        self,
        messages: Sequence[dict[str, str]],
        add_generation_prompt: bool = True,
        tokenize: bool = False,
        **_: Any,
    ) -> str | list[int]:
        """ChatML: `<|im_start|>role\\ncontent<|im_end|>\\n` per message (+ assistant header)."""
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        if add_generation_prompt:
            text += "<|im_start|>assistant\n"
        return self.encode(text) if tokenize else text
