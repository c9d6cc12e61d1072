"""Test problems for the strategies. Each is a cost to MINIMISE; strategies maximise its negative.
Also `unjitted`, which the tests hand to `chex.variants` to run a strategy's ask / tell jitted and
eagerly.

A plain module (not a conftest) so tests import the functions by a name no other package uses.
"""

import functools

import jax.numpy as jnp
import numpy as np


def sphere(x):
    """sum x_i^2; minimum 0 at the origin. x [..., D] -> [...]."""
    return jnp.sum(x**2, axis=-1)


def make_rotated_ellipsoid(num_dims: int, condition: float = 1e3, seed: int = 0):
    """sum_i condition^(i / (D-1)) (R x)_i^2 with a fixed random rotation R; minimum 0 at 0."""
    q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((num_dims, num_dims)))
    rot = jnp.asarray(q, jnp.float32)
    coef = jnp.asarray(condition ** (np.arange(num_dims) / max(num_dims - 1, 1)), jnp.float32)

    def ellipsoid(x):
        return jnp.sum(coef * (x @ rot.T) ** 2, axis=-1)

    return ellipsoid


def rosenbrock(x):
    """sum 100 (x_{i+1} - x_i^2)^2 + (1 - x_i)^2; minimum 0 at (1, ..., 1). D >= 2."""
    return jnp.sum(100.0 * (x[..., 1:] - x[..., :-1] ** 2) ** 2 + (1 - x[..., :-1]) ** 2, axis=-1)


def unjitted(strategy, method: str):
    """`strategy.method` without its jax.jit (jax keeps the Python function as __wrapped__); a
    method that is not jitted itself (CMAES.tell, which picks a compiled program on the host) is
    returned as it is."""
    fn = getattr(type(strategy), method)
    return functools.partial(getattr(fn, "__wrapped__", fn), strategy)
