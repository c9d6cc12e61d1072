"""Population evaluation: all ESSA candidates as one batched, sharded generation program.

`engine`: the compiled program (P members x B prompts as P*B rows, shared weights, per-row singular
values). `evaluator`: the evolution step around it (`essa_generation`: ask -> `PopulationEvaluator`
-> tell), which owns the mesh, the padding, the host reward and the cross-process gather.
"""

from essa_jax.population.engine import population_forward, population_generate
from essa_jax.population.evaluator import (
    PopulationEval,
    PopulationEvaluator,
    PromptBatch,
    Rows,
    ScoreFn,
    essa_generation,
    text_reward,
)

__all__ = [
    "PopulationEval",
    "PopulationEvaluator",
    "PromptBatch",
    "Rows",
    "ScoreFn",
    "essa_generation",
    "population_forward",
    "population_generate",
    "text_reward",
]
