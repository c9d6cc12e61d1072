"""policy_loss against an independent NumPy reference written with explicit loops."""

import itertools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from essa_jax.rl import AGGREGATIONS, LOSS_KINDS, policy_loss

KINDS = LOSS_KINDS
AGGS = AGGREGATIONS


def test_the_one_list_of_loss_kinds_and_aggregations():
    assert LOSS_KINDS == ("grpo", "cispo")
    assert AGGREGATIONS == ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")


def reference_loss(
    logp, old, adv, mask, kind, eps_low, eps_high, agg, max_len, ref, beta, weight_logp=None
):
    """Straight from the formulas (PAPERS.md, "GRPO loss conventions"), one token at a time.

    `weight_logp` (CISPO only) evaluates the detached IS weight at other log-probs, so finite
    differences of this function give the gradient CISPO defines (the weight is a constant).
    """
    B, T = logp.shape
    weight_logp = logp if weight_logp is None else weight_logp
    per_seq_sum, per_seq_cnt = [], []
    clip_lo = clip_hi = n_tok = 0
    for i in range(B):
        s = c = 0.0
        for t in range(T):
            if mask[i, t] == 0:
                continue
            rho = math.exp(logp[i, t] - old[i, t])
            clipped = min(max(rho, 1 - eps_low), 1 + eps_high)
            a = adv[i]
            if kind == "grpo":
                term = -min(rho * a, clipped * a)
                clip_lo += rho < 1 - eps_low and a < 0
                clip_hi += rho > 1 + eps_high and a > 0
            else:
                w = math.exp(weight_logp[i, t] - old[i, t])
                term = -min(max(w, 1 - eps_low), 1 + eps_high) * a * logp[i, t]
                clip_lo += rho < 1 - eps_low
                clip_hi += rho > 1 + eps_high
            if beta > 0:
                d = ref[i, t] - logp[i, t]
                term += beta * (math.exp(d) - d - 1)
            s += term
            c += 1
            n_tok += 1
        per_seq_sum.append(s)
        per_seq_cnt.append(c)
    if agg == "token_mean":
        loss = sum(per_seq_sum) / max(sum(per_seq_cnt), 1)
    elif agg == "seq_mean_token_mean":
        loss = sum(s / max(c, 1) for s, c in zip(per_seq_sum, per_seq_cnt, strict=True)) / B
    else:
        loss = sum(per_seq_sum) / (B * (T if max_len is None else max_len))
    return loss, clip_lo / n_tok, clip_hi / n_tok


def _inputs(seed, B=4, T=7):
    rng = np.random.default_rng(seed)
    logp = rng.uniform(-3.0, -0.05, (B, T))
    old = logp + rng.normal(0.0, 0.35, (B, T))  # ratios well outside [0.8, 1.2] for some tokens
    ref = logp + rng.normal(0.0, 0.5, (B, T))
    adv = rng.normal(0.0, 1.0, B)
    lengths = rng.integers(1, T + 1, B)
    lengths[-1] = 0  # one empty completion: must not produce NaN
    mask = (np.arange(T)[None] < lengths[:, None]).astype(np.float64)
    return logp, old, adv, mask, ref


@pytest.mark.parametrize("kind, agg, beta", list(itertools.product(KINDS, AGGS, (0.0, 0.04))))
def test_loss_matches_numpy_reference(kind, agg, beta):
    logp, old, adv, mask, ref = _inputs(hash((kind, agg, beta)) % 2**31)
    eps_low, eps_high = (1.0, 5.0) if kind == "cispo" else (0.2, 0.28)
    max_len = 11 if agg == "seq_mean_token_sum_norm" else None
    loss, aux = policy_loss(
        jnp.asarray(logp, jnp.float32),
        jnp.asarray(old, jnp.float32),
        jnp.asarray(adv, jnp.float32),
        jnp.asarray(mask, jnp.float32),
        kind=kind,
        eps_low=eps_low,
        eps_high=eps_high,
        agg=agg,
        max_len=max_len,
        ref_logp=jnp.asarray(ref, jnp.float32),
        beta=beta,
    )
    want, lo, hi = reference_loss(
        logp, old, adv, mask, kind, eps_low, eps_high, agg, max_len, ref, beta
    )
    np.testing.assert_allclose(float(loss), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(aux["clip_low_frac"]), lo, atol=1e-6)
    np.testing.assert_allclose(float(aux["clip_high_frac"]), hi, atol=1e-6)
    m = mask > 0
    rho = np.exp(logp - old)[m]
    np.testing.assert_allclose(float(aux["ratio_mean"]), rho.mean(), rtol=1e-5)
    np.testing.assert_allclose(float(aux["ratio_min"]), rho.min(), rtol=1e-5)
    np.testing.assert_allclose(float(aux["ratio_max"]), rho.max(), rtol=1e-5)
    d = (ref - logp)[m]
    np.testing.assert_allclose(float(aux["kl"]), np.mean(np.exp(d) - d - 1), rtol=1e-5)
    np.testing.assert_allclose(float(aux["adv_mean"]), adv.mean(), rtol=1e-5, atol=1e-7)


def test_clipping_is_exercised():
    # Guard against a reference test that passes because no token was ever clipped.
    logp, old, adv, mask, ref = _inputs(3)
    _, lo, hi = reference_loss(logp, old, adv, mask, "grpo", 0.2, 0.2, "token_mean", None, ref, 0)
    assert lo > 0 and hi > 0


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("agg", AGGS)
def test_gradient_matches_finite_differences(kind, agg):
    logp0, old, adv, mask, ref = _inputs(7, B=3, T=4)
    eps_low, eps_high = (1.0, 5.0) if kind == "cispo" else (0.2, 0.2)
    with jax.enable_x64(True):
        args = [jnp.asarray(x, jnp.float64) for x in (old, adv, mask, ref)]

        def f(lp):
            return policy_loss(
                lp,
                args[0],
                args[1],
                args[2],
                kind=kind,
                eps_low=eps_low,
                eps_high=eps_high,
                agg=agg,
                ref_logp=args[3],
                beta=0.1,
            )[0]

        x = jnp.asarray(logp0, jnp.float64)
        grad = np.asarray(jax.grad(f)(x))
        assert grad.dtype == np.float64

    def ref_f(lp):
        return reference_loss(
            lp, old, adv, mask, kind, eps_low, eps_high, agg, None, ref, 0.1, weight_logp=logp0
        )[0]

    h = 1e-6
    fd = np.zeros_like(logp0)
    for i, t in np.ndindex(*logp0.shape):
        e = np.zeros_like(logp0)
        e[i, t] = h
        fd[i, t] = (ref_f(logp0 + e) - ref_f(logp0 - e)) / (2 * h)
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-8)
    assert np.abs(grad).max() > 1e-3  # non-trivial gradient
    np.testing.assert_array_equal(grad[mask == 0], 0.0)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("agg", AGGS)
def test_on_policy_gradient_is_reinforce_with_baseline(kind, agg):
    """ratio = 1: grad of the loss = -sum_t A_i grad log pi(y_it) / normaliser (REINFORCE)."""
    B, T, V = 3, 5, 6
    rng = np.random.default_rng(0)
    theta = jnp.asarray(rng.normal(size=(B, T, V)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, V, (B, T)))
    adv = jnp.asarray(rng.normal(size=B), jnp.float32)
    lengths = np.array([5, 2, 3])
    mask = jnp.asarray(np.arange(T)[None] < lengths[:, None], jnp.float32)

    def logp_of(th):
        lp = jax.nn.log_softmax(th, axis=-1)
        return jnp.take_along_axis(lp, tokens[..., None], axis=-1)[..., 0]

    old = jax.lax.stop_gradient(logp_of(theta))

    def loss_fn(th):
        return policy_loss(logp_of(th), old, adv, mask, kind=kind, agg=agg)[0]

    if agg == "token_mean":
        norm = np.full(B, lengths.sum())
    elif agg == "seq_mean_token_mean":
        norm = B * lengths
    else:
        norm = np.full(B, B * T)
    weights = jnp.asarray(-np.asarray(adv)[:, None] / norm[:, None]) * mask

    def reinforce(th):
        return jnp.sum(weights * logp_of(th))

    np.testing.assert_allclose(jax.grad(loss_fn)(theta), jax.grad(reinforce)(theta), atol=1e-6)


def test_loss_decreases_when_good_tokens_become_likelier():
    # Minimising the loss must raise log-probs of positive-advantage rollouts (reward maximised).
    logp = jnp.full((2, 3), -1.0)
    adv = jnp.array([1.0, -1.0])
    g = jax.grad(lambda lp: policy_loss(lp, logp, adv, jnp.ones((2, 3)))[0])(logp)
    assert np.all(g[0] < 0) and np.all(g[1] > 0)


def test_per_token_advantages_and_entropy_aux():
    logp, old, adv, mask, _ = _inputs(1)
    per_tok = np.repeat(adv[:, None], logp.shape[1], axis=1)
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    a, aux_a = policy_loss(f32(logp), f32(old), f32(adv), f32(mask), entropy=f32(-logp))
    b, _ = policy_loss(f32(logp), f32(old), f32(per_tok), f32(mask))
    # float32 sums of the same terms in other orders: Higham's bound n u sum|terms| (the clipped
    # ratio is at most exp(|logp - old|)), not relative to the loss, which may cancel near 0.
    terms = np.exp(np.abs(logp - old)) * np.abs(per_tok) * mask / max(mask.sum(), 1)
    atol = mask.size * float(np.finfo(np.float32).eps) / 2 * terms.sum()
    assert abs(float(a)) > 10 * atol  # the loss is not 0: the comparison can fail
    np.testing.assert_allclose(a, b, rtol=0, atol=atol)
    np.testing.assert_allclose(aux_a["entropy"], (-logp)[mask > 0].mean(), rtol=1e-5)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"kind": "ppo"}, "kind must be one of"),
        ({"agg": "sum"}, "agg must be one of"),
        ({"beta": 0.1}, "needs ref_logp"),
        ({"eps_low": -0.1}, "eps_low"),
    ],
)
def test_bad_input_errors(kw, match):
    x = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match=match):
        policy_loss(x, x, jnp.zeros(2), x, **kw)
    with pytest.raises(ValueError, match="advantages must be"):
        policy_loss(x, x, jnp.zeros(3), x)


class PolicyLossVariantsTest(chex.TestCase):
    """policy_loss jitted and not (kind / agg static) against the NumPy reference."""

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(
        ("grpo", "token_mean", 0.0), ("cispo", "seq_mean_token_mean", 0.04),
        ("grpo", "seq_mean_token_sum_norm", 0.04),
    )  # fmt: skip
    def test_matches_reference(self, kind, agg, beta):
        logp, old, adv, mask, ref = _inputs(11)
        eps_low, eps_high = (1.0, 5.0) if kind == "cispo" else (0.2, 0.28)

        def f(lp, o, a, m, r):
            return policy_loss(
                lp, o, a, m, kind=kind, eps_low=eps_low, eps_high=eps_high, agg=agg, ref_logp=r,
                beta=beta,
            )  # fmt: skip

        f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
        loss, aux = self.variant(f)(f32(logp), f32(old), f32(adv), f32(mask), f32(ref))
        want, lo, hi = reference_loss(
            logp, old, adv, mask, kind, eps_low, eps_high, agg, None, ref, beta
        )
        chex.assert_trees_all_close(
            (loss, aux["clip_low_frac"], aux["clip_high_frac"]),
            (np.float32(want), np.float32(lo), np.float32(hi)),
            rtol=1e-5,
            atol=1e-6,
        )
