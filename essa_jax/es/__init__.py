"""Evolution strategies as pure init / ask / tell over pytree states; fitness is MAXIMISED.

    strategy = get_strategy("cma_es", num_dims=D, population_size=P, sigma_init=0.1)
    state = strategy.init(key, mean)                   # mean [D]
    population = strategy.ask(key, state)              # [P, D], pure in (key, state)
    state = strategy.tell(state, population, fitness)  # fitness [P], larger is better

Strategies know nothing about models; see `base` for the contract a user's own variant follows
(the `Strategy` protocol). The built-in strategies subclass `base.BaseStrategy`, which does the
bookkeeping they share (best-so-far, non-finite counts, skipped generations, counters, metrics);
each strategy's module holds only its own distribution update.
"""

from essa_jax.es.base import BaseStrategy, SearchError, Strategy
from essa_jax.es.cma_es import CMAES, CMAESState
from essa_jax.es.openai_es import OpenAIES, OpenAIESState
from essa_jax.es.registry import STRATEGIES, get_strategy, register_strategy
from essa_jax.es.sep_cma_es import SepCMAES, SepCMAESState
from essa_jax.es.shaping import SHAPING_FNS, centred_ranks, get_shaping_fn, ranks, raw, z_score

__all__ = [
    "BaseStrategy",
    "CMAES",
    "CMAESState",
    "OpenAIES",
    "OpenAIESState",
    "SHAPING_FNS",
    "STRATEGIES",
    "SearchError",
    "SepCMAES",
    "SepCMAESState",
    "Strategy",
    "centred_ranks",
    "get_shaping_fn",
    "get_strategy",
    "ranks",
    "raw",
    "register_strategy",
    "z_score",
]
