"""LoRA supervised fine-tuning on a task's reference answers (ESSA step 1, arXiv 2507.04453 Sec. 3).

Loss: mean negative log-likelihood of the completion tokens (reference answer + EOS) given the
prompt; prompt tokens carry no loss. Optimiser: AdamW with global-norm clipping (optax). Only the
LoRA factors are trained; base weights are a non-differentiated argument.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from essa_jax.models import sequence_logprobs
from essa_jax.train.rollouts import PromptSet, init_cursor, next_indices


def sft_sequences(data: PromptSet, pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """prompt + target per example, left-padded: (tokens, attention mask, loss mask) `[n, T]`.

    The loss mask is 1 on target positions, aligned with `tokens[:, 1:]` by the caller.
    """
    if not data.targets:
        raise ValueError("SFT needs reference completions (PromptSet.targets is empty)")
    seqs, is_target = [], []
    for row, m, tgt in zip(data.tokens, data.mask, data.targets, strict=True):
        prompt = [int(t) for t, k in zip(row, m, strict=True) if k]
        seqs.append(prompt + list(tgt))
        is_target.append([0] * len(prompt) + [1] * len(tgt))
    length = max(len(s) for s in seqs)
    tokens = np.full((len(seqs), length), pad_id, np.int32)
    mask = np.zeros((len(seqs), length), np.int32)
    loss_mask = np.zeros((len(seqs), length), np.int32)
    for i, (s, t) in enumerate(zip(seqs, is_target, strict=True)):
        tokens[i, length - len(s) :] = s
        mask[i, length - len(s) :] = 1
        loss_mask[i, length - len(s) :] = t
    return tokens, mask, loss_mask


@functools.lru_cache(maxsize=8)
def make_optimizer(learning_rate: float, weight_decay: float, max_grad_norm: float):
    """AdamW (Loshchilov & Hutter 2019) after global-norm clipping.

    Cached: the optimiser is a static argument of the jitted step, so equal settings must give the
    same object for the compiled step to be reused (e.g. by a resumed or repeated run).
    """
    return optax.chain(
        optax.clip_by_global_norm(max_grad_norm),
        optax.adamw(learning_rate, weight_decay=weight_decay),
    )


def sft_loss(lora, params, model_config, tokens, mask, loss_mask):
    """Mean NLL over target tokens: -sum(log p * m) / sum(m), m = loss_mask[:, 1:]."""
    lp = sequence_logprobs(params, model_config, tokens, mask, lora=lora)  # [B, T-1]
    m = loss_mask[:, 1:].astype(jnp.float32)
    return -jnp.sum(lp * m) / jnp.maximum(jnp.sum(m), 1.0)


@functools.partial(jax.jit, static_argnames=("model_config", "optimizer"), donate_argnums=(0, 1))
def sft_step(lora, opt_state, params, model_config, optimizer, tokens, mask, loss_mask):
    """One AdamW step on a batch; returns (lora, opt_state, metrics)."""
    loss, grads = jax.value_and_grad(sft_loss)(lora, params, model_config, tokens, mask, loss_mask)
    updates, opt_state = optimizer.update(grads, opt_state, lora)
    lora = optax.apply_updates(lora, updates)
    return lora, opt_state, {"loss": loss, "grad_norm": optax.tree.norm(grads)}


def train_sft(
    lora: Any,
    params: Any,
    model_config: Any,
    data: PromptSet,
    sft_config: Any,
    *,
    seed: int,
    pad_id: int,
    log_fn=None,
) -> Any:
    """`sft_config.steps` AdamW steps of batch `sft_config.batch_size`; returns the trained LoRA.

    `log_fn(step, metrics)` is called after every step with python floats.
    """
    tokens, mask, loss_mask = sft_sequences(data, pad_id)
    optimizer = make_optimizer(
        float(sft_config.learning_rate),
        float(sft_config.weight_decay),
        float(sft_config.max_grad_norm),
    )
    opt_state = optimizer.init(lora)
    cursor = init_cursor(len(data), seed)
    for step in range(sft_config.steps):
        idx, cursor = next_indices(cursor, sft_config.batch_size)
        lora, opt_state, m = sft_step(
            lora,
            opt_state,
            params,
            model_config,
            optimizer,
            tokens[idx],
            mask[idx],
            loss_mask[idx],
        )
        if log_fn is not None:
            log_fn(step + 1, {k: float(v) for k, v in m.items()})
    return lora
