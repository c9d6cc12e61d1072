"""Advantages and focal weights against hand-computed numbers (F-GRPO arXiv 2602.06717)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from essa_jax.rl import (
    GRPOConfig,
    compute_advantages,
    focal_group_advantages,
    focal_weights,
    group_advantages,
    success_rate,
    zero_variance_fraction,
)


def _binary_groups(n, counts):
    """Flat binary rewards: one group of n per entry of counts, `count` ones first."""
    return jnp.asarray(np.concatenate([[1.0] * c + [0.0] * (n - c) for c in counts]), jnp.float32)


def test_focal_weights_paper_table():
    rewards = _binary_groups(8, range(1, 8))
    g = np.asarray(focal_weights(rewards, 8, 0.5)).reshape(7, 8)
    expected = [0.935, 0.866, 0.791, 0.707, 0.612, 0.500, 0.354]
    np.testing.assert_allclose(g[:, 0], expected, atol=5e-4)
    # One scalar per group, broadcast to every rollout of it.
    np.testing.assert_array_equal(g, np.repeat(g[:, :1], 8, axis=1))


def test_focal_weights_general_rewards_and_clipping():
    # r_wrong=-1, r_correct=1: mean 0 -> mu 0.5; mean above r_correct clips to mu 1 -> weight 0.
    rewards = jnp.array([1.0, -1.0, 2.0, 2.0])
    mu = success_rate(rewards, 2, r_correct=1.0, r_wrong=-1.0)
    np.testing.assert_allclose(mu, [0.5, 0.5, 1.0, 1.0])
    g = focal_weights(rewards, 2, 2.0, r_correct=1.0, r_wrong=-1.0)
    np.testing.assert_allclose(g, [0.25, 0.25, 0.0, 0.0])


def test_group_advantages_bessel_and_eps():
    r = jnp.array([1.0, 0.0, 0.0, 0.0, 3.0, 1.0, 2.0, 2.0])
    adv = np.asarray(group_advantages(r, 4, eps=1e-6))
    for g in range(2):
        x = np.asarray(r[4 * g : 4 * g + 4], np.float64)
        ref = (x - x.mean()) / (x.std(ddof=1) + 1e-6)
        np.testing.assert_allclose(adv[4 * g : 4 * g + 4], ref, rtol=1e-5)
    pop = np.asarray(group_advantages(r, 4, ddof=0, eps=0.0))
    x = np.asarray(r[:4], np.float64)
    np.testing.assert_allclose(pop[:4], (x - x.mean()) / x.std(), rtol=1e-5)


def test_group_advantages_batch_and_none_scale():
    r = jnp.array([1.0, 0.0, 0.0, 0.0, 3.0, 1.0, 2.0, 2.0])
    x = np.asarray(r, np.float64).reshape(2, 4)
    centred = (x - x.mean(1, keepdims=True)).reshape(-1)
    np.testing.assert_allclose(group_advantages(r, 4, scale="none"), centred, rtol=1e-6)
    np.testing.assert_allclose(
        group_advantages(r, 4, scale="batch", eps=0.0), centred / x.std(ddof=1), rtol=1e-5
    )


def test_all_correct_and_all_wrong_groups_have_zero_advantage():
    rewards = _binary_groups(8, [0, 8, 3])
    for gamma in (0.0, 0.5, 2.0):
        a = np.asarray(focal_group_advantages(rewards, 8, gamma)).reshape(3, 8)
        np.testing.assert_array_equal(a[:2], 0.0)
        assert np.all(np.abs(a[2]) > 0.1)
    assert float(zero_variance_fraction(rewards, 8)) == pytest.approx(2 / 3)


def test_gamma_zero_is_grpo_exactly():
    key = jax.random.key(0)
    rewards = jnp.concatenate([_binary_groups(8, [0, 8, 1, 7]), jax.random.uniform(key, (16,))])
    for scale in ("group", "batch", "none"):
        plain = group_advantages(rewards, 8, scale)
        focal = focal_weights(rewards, 8, 0.0) * plain
        np.testing.assert_array_equal(np.asarray(focal), np.asarray(plain))
    np.testing.assert_array_equal(focal_weights(rewards, 8, 0.0), 1.0)


def test_jit_and_stop_gradient():
    rewards = _binary_groups(4, [1, 2])
    f = jax.jit(focal_group_advantages, static_argnums=(1,), static_argnames=("scale",))
    np.testing.assert_allclose(f(rewards, 4, 0.5), focal_group_advantages(rewards, 4, 0.5))
    grad = jax.grad(lambda r: jnp.sum(focal_weights(r, 4, 0.5)))(rewards)
    np.testing.assert_array_equal(grad, 0.0)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: group_advantages(jnp.zeros(10), 4), "must divide the number of rewards"),
        (lambda: focal_weights(jnp.zeros(10), 3, 0.5), "must divide"),
        (lambda: group_advantages(jnp.zeros(8), 0), "positive int"),
        (lambda: group_advantages(jnp.zeros((2, 4)), 4), "flat"),
        (lambda: group_advantages(jnp.zeros(8), 4, scale="std"), "scale must be one of"),
        (lambda: group_advantages(jnp.zeros(4), 1), "ddof"),
        (lambda: focal_weights(jnp.zeros(8), 4, -1.0), "gamma"),
        (lambda: focal_weights(jnp.zeros(8), 4, 0.5, r_correct=0.0), "must differ"),
    ],
)
def test_bad_input_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def _numpy_advantages(r, n, scale, eps=1e-6, ddof=1):
    x = np.asarray(r, np.float64).reshape(-1, n)
    centred = x - x.mean(1, keepdims=True)
    if scale == "group":
        return (centred / (x.std(1, ddof=ddof, keepdims=True) + eps)).reshape(-1)
    if scale == "batch":
        return (centred / (x.std(ddof=ddof) + eps)).reshape(-1)
    return centred.reshape(-1)


class PureFunctionsTest(chex.TestCase):
    """The pure advantage / focal functions, jitted and not, against NumPy and the paper."""

    REWARDS = np.array([1.0, 0.0, 0.0, 0.0, 3.0, 1.0, 2.0, 2.0, 1.0, 1.0, 1.0, 1.0], np.float32)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters("group", "batch", "none")
    def test_group_advantages(self, scale):
        f = self.variant(group_advantages, static_argnums=(1, 2))
        got = f(jnp.asarray(self.REWARDS), 4, scale)
        np.testing.assert_allclose(got, _numpy_advantages(self.REWARDS, 4, scale), rtol=1e-5)
        np.testing.assert_array_equal(np.asarray(got)[8:], 0.0)  # zero-variance group

    @chex.variants(with_jit=True, without_jit=True)
    def test_focal_weights_table(self):
        f = self.variant(focal_weights, static_argnums=(1,))
        g = np.asarray(f(_binary_groups(8, range(1, 8)), 8, 0.5)).reshape(7, 8)
        expected = [0.935, 0.866, 0.791, 0.707, 0.612, 0.500, 0.354]
        np.testing.assert_allclose(g[:, 0], expected, atol=5e-4)

    @chex.variants(with_jit=True, without_jit=True)
    def test_success_rate(self):
        f = self.variant(success_rate, static_argnums=(1, 2, 3))
        mu = f(jnp.array([1.0, -1.0, 2.0, 2.0]), 2, 1.0, -1.0)
        np.testing.assert_allclose(mu, [0.5, 0.5, 1.0, 1.0])

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(("group", "none", 0.0), ("none", "focal", 0.5), ("batch", "focal", 2))
    def test_compute_advantages_composes_estimator_and_weighting(self, adv, weighting, gamma):
        cfg = GRPOConfig(group_size=4, advantage=adv, weighting=weighting, gamma=gamma)
        f = self.variant(compute_advantages, static_argnums=(1,))
        rewards = jnp.asarray(self.REWARDS)
        w = np.asarray(focal_weights(rewards, 4, gamma)) if weighting == "focal" else np.ones(12)
        want = (w * _numpy_advantages(self.REWARDS, 4, adv), w)
        chex.assert_trees_all_close(f(rewards, cfg), want, rtol=1e-5, atol=1e-6)
