"""The one optimiser builder of SFT and the GRPO family: AdamW after global-norm clipping."""

from __future__ import annotations

import functools

import optax

from essa_jax.rl.config import GRPOConfig


@functools.lru_cache(maxsize=16)
def adamw(
    learning_rate: float,
    weight_decay: float,
    max_grad_norm: float,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
) -> optax.GradientTransformation:
    """AdamW (Loshchilov & Hutter 2019, arXiv 1711.05101) after clipping the gradient to global
    norm `max_grad_norm` (F-GRPO, arXiv 2602.06717: lr 1e-6, wd 0.01, clip 1.0).

    Cached: the optimiser is a static argument of the jitted SFT step, so equal settings must give
    the same object for a compiled step to be reused (e.g. by a resumed or repeated run).
    """
    return optax.chain(
        optax.clip_by_global_norm(max_grad_norm),
        optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay),
    )


def make_optimizer(cfg: GRPOConfig) -> optax.GradientTransformation:
    """`adamw` with a `GRPOConfig`'s settings."""
    return adamw(
        cfg.learning_rate,
        cfg.weight_decay,
        cfg.max_grad_norm,
        b1=cfg.adam_b1,
        b2=cfg.adam_b2,
        eps=cfg.adam_eps,
    )
