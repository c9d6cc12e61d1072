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
