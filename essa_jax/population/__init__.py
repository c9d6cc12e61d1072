"""Population evaluation: all ESSA candidates as one batched, sharded generation program.

See `engine` for the hot path, `mesh` for sharding and padding, `fitness` for rewards -> fitness.
"""

from essa_jax.population.engine import population_forward, population_generate
from essa_jax.population.fitness import (
    PopulationEval,
    decode_completions,
    evaluate_genome,
    evaluate_population,
    sample_prompt_indices,
)
from essa_jax.population.mesh import (
    DATA_AXIS,
    POP_AXIS,
    make_population_mesh,
    mesh_sizes,
    padded_size,
    replicate,
)

__all__ = [
    "DATA_AXIS",
    "POP_AXIS",
    "PopulationEval",
    "decode_completions",
    "evaluate_genome",
    "evaluate_population",
    "make_population_mesh",
    "mesh_sizes",
    "padded_size",
    "population_forward",
    "population_generate",
    "replicate",
    "sample_prompt_indices",
]
