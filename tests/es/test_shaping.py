"""Fitness shaping: one signature, maximisation order, NaN safety, against scipy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import rankdata

from essa_jax.es import SHAPING_FNS, centred_ranks, get_shaping_fn, ranks, raw, z_score


def test_centred_ranks_match_scipy_average_ranks():
    f = np.asarray([3.0, -1.0, 2.0, 2.0, 10.0, 0.5], np.float32)
    expected = (rankdata(f, method="average") - 1) / (len(f) - 1) - 0.5
    np.testing.assert_allclose(centred_ranks(jnp.asarray(f)), expected, rtol=1e-6)
    assert float(centred_ranks(jnp.asarray(f))[4]) == 0.5  # the largest fitness is the best


def test_ranks_put_nonfinite_last_and_tie_them():
    f = jnp.asarray([1.0, jnp.nan, 5.0, jnp.inf, -jnp.inf, 2.0])
    # all three non-finite values tie at the bottom: average rank of positions 0, 1, 2
    np.testing.assert_allclose(ranks(f), [3.0, 1.0, 5.0, 1.0, 1.0, 4.0])


def test_centred_ranks_invariant_to_monotone_transforms():
    f = jax.random.normal(jax.random.key(0), (17,))
    np.testing.assert_allclose(centred_ranks(f), centred_ranks(jnp.exp(3 * f) + 7), atol=1e-7)


def test_z_score_matches_numpy_on_finite_and_worst_on_nonfinite():
    f = np.asarray([1.0, 4.0, np.nan, 2.0, -np.inf], np.float32)
    fin = f[np.isfinite(f)]
    z = (fin - fin.mean()) / (fin.std() + 1e-8)
    out = np.asarray(z_score(jnp.asarray(f)))
    np.testing.assert_allclose(out[[0, 1, 3]], z, rtol=1e-5)
    assert out[2] == out[4] == z.min()


def test_raw_replaces_nonfinite_by_finite_minimum():
    out = raw(jnp.asarray([1.0, jnp.nan, -3.0, jnp.inf]))
    np.testing.assert_array_equal(out, [1.0, -3.0, -3.0, -3.0])


@pytest.mark.parametrize("name", sorted(SHAPING_FNS))
def test_all_nonfinite_gives_zeros_and_functions_jit_and_vmap(name):
    fn = get_shaping_fn(name)
    bad = jnp.asarray([jnp.nan, jnp.inf, -jnp.inf, jnp.nan])
    np.testing.assert_array_equal(jax.jit(fn)(bad), np.zeros(4))
    batch = jax.random.normal(jax.random.key(1), (3, 8))
    out = jax.vmap(fn)(batch)
    assert out.shape == (3, 8) and bool(jnp.all(jnp.isfinite(out)))
    # shaping keeps the order of fitness (maximisation: larger stays larger)
    for row, shaped in zip(batch, out, strict=True):
        assert np.array_equal(np.argsort(np.asarray(row)), np.argsort(np.asarray(shaped)))


def test_get_shaping_fn_errors_list_valid_names():
    with pytest.raises(ValueError, match="centred_ranks.*raw.*z_score"):
        get_shaping_fn("rank")
    assert get_shaping_fn(raw) is raw
