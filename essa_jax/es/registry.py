"""Strategies by name, so configs pick one with a string and tests run every one the same way."""

from __future__ import annotations

from typing import Any

from essa_jax.es.base import Strategy
from essa_jax.es.cma_es import CMAES
from essa_jax.es.openai_es import OpenAIES
from essa_jax.es.sep_cma_es import SepCMAES

STRATEGIES: dict[str, type] = {
    "cma_es": CMAES,
    "sep_cma_es": SepCMAES,
    "openai_es": OpenAIES,
}


def get_strategy(name: str, **kwargs: Any) -> Strategy:
    """Build the strategy registered under `name` with constructor keyword arguments `kwargs`.

    Example: ``get_strategy("cma_es", num_dims=448, population_size=96, sigma_init=0.1)``.
    """
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; valid names: {sorted(STRATEGIES)}")
    return STRATEGIES[name](**kwargs)


def register_strategy(name: str, cls: type) -> type:
    """Register a user's strategy class under `name`, so configs can pick it by string.

    `cls(**kwargs)` must build an object with `init`, `ask`, `tell`, `num_dims` and
    `population_size` whose state has `mean` [D] and `sigma` ([] or [D]) (see
    `essa_jax.es.base.Strategy`); subclassing `essa_jax.es.BaseStrategy`
    gives the shared bookkeeping but is optional. Returns `cls`, so it works as a decorator via
    `functools.partial(register_strategy, "name")`.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"strategy name must be a non-empty string, got {name!r}")
    missing = [m for m in ("init", "ask", "tell") if not callable(getattr(cls, m, None))]
    if missing:
        raise TypeError(f"strategy {name!r} ({cls!r}) lacks the methods {missing}; see es.base")
    if name in STRATEGIES and STRATEGIES[name] is not cls:
        raise ValueError(f"strategy name {name!r} is taken by {STRATEGIES[name]!r}")
    STRATEGIES[name] = cls
    return cls
