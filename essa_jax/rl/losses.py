"""Policy losses of the GRPO family: GRPO / DAPO (clipped ratio), CISPO (clipped weight).

The loss is MINIMISED by the optimiser, so it is minus the surrogate objective: minimising it
maximises reward. Inputs are per completion token, `[B, T]` with a mask of the real completion
tokens; advantages are per sequence `[B]` (or per token `[B, T]`).
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

LossKind = Literal["grpo", "cispo"]
Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
# The one list of each (GRPOConfig and the experiment config validate against them). DAPO is not a
# kind: it is "grpo" with clip-higher (eps_high = 0.28).
LOSS_KINDS = ("grpo", "cispo")
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")


def k3_kl(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """Per-token k3 estimator of KL(pi || pi_ref) (Schulman 2020; GRPO, arXiv 2402.03300, eq. 4).

    kl = exp(ref - logp) - (ref - logp) - 1   (>= 0, unbiased for samples from pi)
    """
    d = ref_logp - logp
    return jnp.exp(d) - d - 1.0


def aggregate(
    per_token: jax.Array, mask: jax.Array, agg: Aggregation, max_len: int | None = None
) -> jax.Array:
    """Reduce a per-token loss [B, T] to a scalar.

      * "token_mean": sum over all real tokens / number of real tokens (DAPO, arXiv 2503.14476);
      * "seq_mean_token_mean": mean over sequences of each sequence's token mean (GRPO);
      * "seq_mean_token_sum_norm": sum over real tokens / (B * max_len) with a constant max_len,
        default T (Dr.GRPO, arXiv 2503.20783), so no length bias.

    Sequences or batches with no real token contribute 0 (denominators are clamped to >= 1, as in
    TRL), never NaN.
    """
    if agg not in AGGREGATIONS:
        raise ValueError(f"agg must be one of {AGGREGATIONS}, got {agg!r}")
    masked = per_token * mask
    if agg == "token_mean":
        return jnp.sum(masked) / jnp.maximum(jnp.sum(mask), 1.0)
    if agg == "seq_mean_token_mean":
        per_seq = jnp.sum(masked, axis=-1) / jnp.maximum(jnp.sum(mask, axis=-1), 1.0)
        return jnp.mean(per_seq)
    length = per_token.shape[-1] if max_len is None else max_len
    if length < 1:
        raise ValueError(f"max_len must be >= 1 for seq_mean_token_sum_norm, got {max_len!r}")
    return jnp.sum(masked) / (per_token.shape[0] * length)


def micro_batch_weights(mask: jax.Array, agg: Aggregation) -> jax.Array:
    """Weights w [n] with aggregate(x, m, agg) = sum_i w_i aggregate(x_i, m_i, agg), exactly.

    mask [n, b, T]: a mini-batch m [n*b, T] split into n micro-batches m_i of b rows (gradient
    accumulation: the micro-batch losses, and so their gradients, add up to the mini-batch's).
      * "token_mean": w_i = max(N_i, 1) / max(N, 1), N_i / N the real tokens of micro-batch i /
        of the mini-batch (a micro-batch without tokens has loss 0 either way);
      * "seq_mean_token_mean", "seq_mean_token_sum_norm": w_i = b / (n b) = 1 / n (their
        denominators count rows: B, or B * max_len).
    """
    if agg not in AGGREGATIONS:
        raise ValueError(f"agg must be one of {AGGREGATIONS}, got {agg!r}")
    mask = mask.astype(jnp.float32)
    if agg == "token_mean":
        counts = jnp.sum(mask, axis=(1, 2))
        return jnp.maximum(counts, 1.0) / jnp.maximum(jnp.sum(counts), 1.0)
    return jnp.full(mask.shape[:1], 1.0 / mask.shape[0], jnp.float32)


def combine_micro_batch_aux(
    aux: dict[str, jax.Array], mask: jax.Array, weights: jax.Array
) -> dict[str, jax.Array]:
    """The `policy_loss` diagnostics of a mini-batch from those of its n micro-batches.

    aux: each value [n] (stacked over micro-batches); mask [n, b, T]; weights [n] from
    `micro_batch_weights`. Loss terms add with the weights, masked token means with the token
    shares, extremes by min / max over micro-batches holding tokens, adv_mean / adv_std pool the
    equal-sized micro-batches: all equal to `policy_loss` on the whole mini-batch (to rounding).
    """
    counts = jnp.sum(mask.astype(jnp.float32), axis=(1, 2))
    share = counts / jnp.maximum(jnp.sum(counts), 1.0)
    has = counts > 0
    out = {}
    for k, v in aux.items():
        if k == "pg_loss":
            out[k] = jnp.sum(weights * v)
        elif k == "ratio_min":
            out[k] = jnp.where(jnp.any(has), jnp.min(jnp.where(has, v, jnp.inf)), 1.0)
        elif k == "ratio_max":
            out[k] = jnp.where(jnp.any(has), jnp.max(jnp.where(has, v, -jnp.inf)), 1.0)
        elif k == "adv_min":
            out[k] = jnp.min(v)
        elif k == "adv_max":
            out[k] = jnp.max(v)
        elif k == "adv_mean":
            out[k] = jnp.mean(v)
        elif k == "adv_std":
            mean = jnp.mean(aux["adv_mean"])
            var = jnp.mean(v**2 + aux["adv_mean"] ** 2) - mean**2
            out[k] = jnp.sqrt(jnp.maximum(var, 0.0))
        else:  # clip fractions, ratio_mean, kl, entropy: masked token means
            out[k] = jnp.sum(share * v)
    return out


def _masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def policy_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    kind: LossKind = "grpo",
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    agg: Aggregation = "token_mean",
    max_len: int | None = None,
    ref_logp: jax.Array | None = None,
    beta: float = 0.0,
    entropy: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """GRPO / DAPO / CISPO policy loss (to be minimised) with optional k3 KL penalty.

    Per token, with rho = exp(logp - old_logp) and A the rollout's advantage:
      * kind="grpo" (also DAPO with eps_high > eps_low, "clip-higher", arXiv 2503.14476):
            l = -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)          (PPO/GRPO surrogate)
      * kind="cispo" (MiniMax-M1, arXiv 2506.13585, eq. 4):
            l = -sg(clip(rho, 1 - eps_low, 1 + eps_high)) A logp
        the importance weight is clipped and detached, so every token keeps a gradient; the F-GRPO
        paper's setting is eps_low = 1.0, eps_high = 5.0 (weight in [0, 6]).
      * beta > 0 adds beta * k3(logp, ref_logp) per token (GRPO eq. 4).
    Then `aggregate(l, mask, agg, max_len)`.

    Args:
      logp: [B, T] log-probs of the sampled tokens under the policy being optimised.
      old_logp: [B, T] log-probs under the policy that sampled them (treated as constant).
      advantages: [B] per rollout or [B, T] per token (treated as constant).
      mask: [B, T] 1 for real completion tokens, 0 for padding / prompt.
      kind: "grpo" | "cispo".
      eps_low, eps_high: clip range [1 - eps_low, 1 + eps_high] of the ratio (grpo) or of the
        weight (cispo).
      agg: "token_mean" | "seq_mean_token_mean" | "seq_mean_token_sum_norm".
      max_len: Dr.GRPO's constant normaliser (default T); only used by "seq_mean_token_sum_norm".
      ref_logp: [B, T] reference-policy log-probs; required when beta > 0.
      beta: KL weight.
      entropy: optional [B, T] per-token entropies, only reported in aux.

    Returns:
      (loss, aux): scalar loss and a dict of scalar diagnostics: clip_low_frac / clip_high_frac
      (grpo: tokens where the clipped branch is active, i.e. receives no gradient; cispo: tokens
      whose weight was truncated), ratio_mean / ratio_min / ratio_max, kl (masked token mean, 0
      without ref_logp), entropy (if given), adv_mean / adv_std / adv_min / adv_max (over rollouts),
      pg_loss (loss without the KL term).
    """
    if kind not in LOSS_KINDS:
        raise ValueError(f"kind must be one of {LOSS_KINDS}, got {kind!r}")
    if logp.ndim != 2 or old_logp.shape != logp.shape or mask.shape != logp.shape:
        raise ValueError(
            "logp, old_logp and mask must all be [B, T]; got "
            f"{logp.shape}, {old_logp.shape}, {mask.shape}"
        )
    if advantages.shape not in ((logp.shape[0],), logp.shape):
        raise ValueError(
            f"advantages must be [B]={logp.shape[:1]} or [B, T]={logp.shape}, "
            f"got {advantages.shape}"
        )
    if not (eps_low >= 0 and eps_high >= 0):
        raise ValueError(f"eps_low and eps_high must be >= 0, got {eps_low!r}, {eps_high!r}")
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta!r}")
    if beta > 0 and ref_logp is None:
        raise ValueError("beta > 0 needs ref_logp (log-probs under the reference policy)")

    mask = mask.astype(logp.dtype)
    old_logp = jax.lax.stop_gradient(old_logp)
    adv_flat = jax.lax.stop_gradient(advantages).astype(logp.dtype)
    adv = adv_flat[:, None] if adv_flat.ndim == 1 else adv_flat
    ratio = jnp.exp(logp - old_logp)
    lo, hi = 1.0 - eps_low, 1.0 + eps_high
    clipped = jnp.clip(ratio, lo, hi)

    if kind == "grpo":
        per_token = -jnp.minimum(ratio * adv, clipped * adv)
        # The min picks the clipped branch (zero gradient) exactly in these two regions.
        low = (ratio < lo) & (adv < 0)
        high = (ratio > hi) & (adv > 0)
    else:
        per_token = -jax.lax.stop_gradient(clipped) * adv * logp
        low = ratio < lo
        high = ratio > hi

    pg_loss = aggregate(per_token, mask, agg, max_len)
    loss = pg_loss
    if ref_logp is not None:
        kl_tok = k3_kl(logp, jax.lax.stop_gradient(ref_logp))
        kl = _masked_mean(kl_tok, mask)
        if beta > 0:
            loss = loss + beta * aggregate(kl_tok, mask, agg, max_len)
    else:
        kl = jnp.zeros((), logp.dtype)

    ratio_d = jax.lax.stop_gradient(ratio)
    has_tok = jnp.sum(mask) > 0
    aux = {
        "pg_loss": jax.lax.stop_gradient(pg_loss),
        "clip_low_frac": _masked_mean(low.astype(logp.dtype), mask),
        "clip_high_frac": _masked_mean(high.astype(logp.dtype), mask),
        "ratio_mean": _masked_mean(ratio_d, mask),
        "ratio_min": jnp.where(has_tok, jnp.min(jnp.where(mask > 0, ratio_d, jnp.inf)), 1.0),
        "ratio_max": jnp.where(has_tok, jnp.max(jnp.where(mask > 0, ratio_d, -jnp.inf)), 1.0),
        "kl": jax.lax.stop_gradient(kl),
        "adv_mean": jnp.mean(adv_flat),
        "adv_std": jnp.std(adv_flat),
        "adv_min": jnp.min(adv_flat),
        "adv_max": jnp.max(adv_flat),
    }
    if entropy is not None:
        aux["entropy"] = _masked_mean(jax.lax.stop_gradient(entropy).astype(logp.dtype), mask)
    return loss, aux
