"""Fitness shaping: one signature, maximisation order, NaN safety, against scipy / NumPy references.

The shaping functions are pure, so every reference check runs with and without jit
(`chex.variants`, as optax's tests do)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from scipy.stats import rankdata

from essa_jax.es import SHAPING_FNS, centred_ranks, get_shaping_fn, ranks, raw, z_score


class ShapingReferenceTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_centred_ranks_match_scipy_average_ranks(self):
        f = np.asarray([3.0, -1.0, 2.0, 2.0, 10.0, 0.5], np.float32)
        expected = (rankdata(f, method="average") - 1) / (len(f) - 1) - 0.5
        out = self.variant(centred_ranks)(jnp.asarray(f))
        chex.assert_trees_all_close(out, expected.astype(np.float32), rtol=1e-6)
        assert float(out[4]) == 0.5  # the largest fitness is the best

    @chex.variants(with_jit=True, without_jit=True)
    def test_ranks_put_nonfinite_last_and_tie_them(self):
        f = jnp.asarray([1.0, jnp.nan, 5.0, jnp.inf, -jnp.inf, 2.0])
        # all three non-finite values tie at the bottom: average rank of positions 0, 1, 2
        expected = np.asarray([3.0, 1.0, 5.0, 1.0, 1.0, 4.0], np.float32)
        chex.assert_trees_all_equal(self.variant(ranks)(f), expected)

    @chex.variants(with_jit=True, without_jit=True)
    def test_centred_ranks_invariant_to_monotone_transforms(self):
        f = jax.random.normal(jax.random.key(0), (17,))
        shaped = self.variant(centred_ranks)
        chex.assert_trees_all_close(shaped(f), shaped(jnp.exp(3 * f) + 7), atol=1e-7)

    @chex.variants(with_jit=True, without_jit=True)
    def test_z_score_matches_numpy_on_finite_and_worst_on_nonfinite(self):
        f = np.asarray([1.0, 4.0, np.nan, 2.0, -np.inf], np.float32)
        fin = f[np.isfinite(f)]
        z = (fin - fin.mean()) / (fin.std() + 1e-8)
        out = np.asarray(self.variant(z_score)(jnp.asarray(f)))
        chex.assert_trees_all_close(out[[0, 1, 3]], z, rtol=1e-5)
        assert out[2] == out[4] == z.min()

    @chex.variants(with_jit=True, without_jit=True)
    def test_raw_replaces_nonfinite_by_finite_minimum(self):
        out = self.variant(raw)(jnp.asarray([1.0, jnp.nan, -3.0, jnp.inf]))
        chex.assert_trees_all_equal(out, np.asarray([1.0, -3.0, -3.0, -3.0], np.float32))

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(*sorted(SHAPING_FNS))
    def test_all_nonfinite_gives_zeros_and_order_is_kept(self, name):
        fn = self.variant(get_shaping_fn(name))
        bad = jnp.asarray([jnp.nan, jnp.inf, -jnp.inf, jnp.nan])
        chex.assert_trees_all_equal(fn(bad), np.zeros(4, np.float32))
        batch = jax.random.normal(jax.random.key(1), (3, 8))
        out = jax.vmap(fn)(batch)
        chex.assert_shape(out, (3, 8))
        chex.assert_tree_all_finite(out)
        # shaping keeps the order of fitness (maximisation: larger stays larger)
        for row, shaped in zip(batch, out, strict=True):
            assert np.array_equal(np.argsort(np.asarray(row)), np.argsort(np.asarray(shaped)))


def test_get_shaping_fn_errors_list_valid_names():
    with pytest.raises(ValueError, match="centred_ranks.*raw.*z_score"):
        get_shaping_fn("rank")
    assert get_shaping_fn(raw) is raw
