"""A self-contained ESSA run over the run mesh, for scaling measurements and tests.

The generation is the library's own (`essa_jax.population.essa_generation` with a
`PopulationEvaluator`), exactly as ESSA distributes it (arXiv 2507.04453, Sec. 3): every process
asks the same strategy state with the same key, each device generates for its members only (one
batch of members x prompts rows against shared base weights), each process scores its own rows,
the per-row scores are gathered and every process applies the identical `tell`.

Fitness here is the mean log-probability of a member's greedy completions on fixed random prompts:
continuous (so a member mix-up or a layout dependence shows in the numbers) and free of tokenizers
and tasks. The model is `essa_jax.models.tiny` (random weights); the adapter is a LoRA with a random
non-zero B (a fresh LoRA has B = 0, hence s_B = 0, and the genome could not act).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from essa_jax import lora as lora_lib
from essa_jax.es import get_strategy
from essa_jax.mesh import POP_AXIS, make_mesh
from essa_jax.models import forward
from essa_jax.models.tiny import tiny_model
from essa_jax.population import (
    PopulationEval,
    PopulationEvaluator,
    PromptBatch,
    Rows,
    essa_generation,
)
from essa_jax.scaling import comm


def mean_logprob(rows: Rows) -> np.ndarray:
    """Score of each row: the mean log-probability of its generated tokens."""
    g = rows.generation
    lp = np.asarray(g.logprobs, np.float32) * np.asarray(g.mask, np.float32)
    return lp.sum(axis=-1) / np.maximum(np.asarray(g.mask, np.float32).sum(axis=-1), 1)


@dataclasses.dataclass
class MeshESSA:
    """The pieces of a mesh-wide ESSA run; `generation(state, g)` advances it by one."""

    strategy: Any
    evaluator: PopulationEvaluator
    basis: Any
    batch: PromptBatch
    run_key: jax.Array

    @property
    def mesh(self):
        return self.evaluator.mesh

    def population(self, state: Any, g: int) -> tuple[jax.Array, jax.Array]:
        """The population of generation g and its evaluation key (as `essa_generation` draws)."""
        k_ask, k_gen = jax.random.split(jax.random.fold_in(self.run_key, g))
        return self.strategy.ask(k_ask, state), k_gen

    def evaluate(self, z: jax.Array, k_gen: jax.Array) -> PopulationEval:
        return self.evaluator(self.basis, z, self.batch, k_gen)

    def fitness(self, z: jax.Array, k_gen: jax.Array) -> np.ndarray:
        return self.evaluate(z, k_gen).fitness

    def generation(self, state: Any, g: int) -> tuple[Any, np.ndarray]:
        state, ev = essa_generation(
            self.strategy, state, jax.random.fold_in(self.run_key, g), self.evaluate
        )
        return state, ev.fitness

    def lowered_fitness(self, state: Any):
        """The generation program, lowered (for communication accounting)."""
        z, k_gen = self.population(state, 0)
        return self.evaluator.lower(self.basis, z, self.batch, k_gen)


def make_mesh_essa(
    population_size: int = 8,
    prompts: int = 2,
    *,
    prompt_len: int = 6,
    new_tokens: int = 4,
    preset: str = "tiny",
    rank: int = 2,
    sigma_init: float = 0.5,
    seed: int = 0,
    mesh: Any = None,
    rows_per_chunk: int = 0,
) -> tuple[MeshESSA, Any]:
    """(MeshESSA, initial strategy state); the mesh defaults to `make_mesh()` (all devices).

    population_size need not divide the mesh's population axis (padding, `essa_jax.mesh`).
    rows_per_chunk: the evaluator's (rows each device generates at once; 0 = from its memory).
    """
    mesh = make_mesh() if mesh is None else mesh
    key = jax.random.PRNGKey(seed)
    k_lora, k_b, k_prompt, k_init, k_run = jax.random.split(key, 5)
    cfg, params = tiny_model(preset, seed)
    lcfg = lora_lib.LoraConfig(rank=rank, alpha=2.0 * rank, targets=("k", "o", "q", "v"))
    lora = lora_lib.init_lora(k_lora, cfg, lcfg)
    lora = {
        t: a.replace(b=0.5 * jax.random.normal(jax.random.fold_in(k_b, i), a.b.shape))
        for i, (t, a) in enumerate(sorted(lora.items()))
    }
    basis, layout = lora_lib.svd_factorize(lora, 1.0)
    strategy = get_strategy(
        "cma_es", num_dims=layout.size, population_size=population_size, sigma_init=sigma_init
    )
    state = strategy.init(k_init, jnp.zeros((layout.size,), jnp.float32))
    tokens = np.asarray(jax.random.randint(k_prompt, (prompts, prompt_len), 3, 99))
    batch = PromptBatch(tokens, np.ones_like(tokens), [""] * prompts)
    evaluator = PopulationEvaluator(
        params,
        cfg,
        layout,
        mesh=mesh,
        score=mean_logprob,
        max_new_tokens=new_tokens,
        greedy=True,
        eos_token_ids=(2,),
        rows_per_chunk=rows_per_chunk,
    )
    return MeshESSA(strategy, evaluator, basis, batch, k_run), state


def lora_gradient_traffic(rank: int = 8, preset: str = "tiny") -> dict:
    """HLO vs by-construction bytes of a data-parallel LoRA gradient of the tiny model (batch
    sharded over every device of `make_mesh()`, adapter replicated): the all-reduce GRPO pays
    per optimizer update (essa_jax.scaling.comm)."""
    cfg, params = tiny_model(preset, 0)
    lcfg = lora_lib.LoraConfig(rank=rank, alpha=2.0 * rank, targets=("q", "k", "v", "o"))
    lora = lora_lib.init_lora(jax.random.PRNGKey(1), cfg, lcfg)
    mesh = make_mesh()
    n = jax.device_count()
    tokens = jax.device_put(
        jax.random.randint(jax.random.PRNGKey(2), (2 * n, 12), 3, 99),
        NamedSharding(mesh, P(POP_AXIS)),
    )

    def loss(lo, params, tokens):
        logits = forward(params, cfg, tokens[:, :-1], lora=lo)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))

    grad_fn = jax.jit(jax.grad(loss), out_shardings=NamedSharding(mesh, P()))
    got = comm.count_collectives(grad_fn, lora, params, tokens)
    want = comm.grpo_step_bytes(comm.tree_bytes(lora), n)
    return {
        "lora_bytes": comm.tree_bytes(lora),
        "hlo_payload_bytes": got.payload_bytes,
        "hlo_by_kind": got.by_kind,
        "construction_payload_bytes": want.payload_bytes,
        "hlo_wire_bytes_per_device": got.wire_bytes_per_device,
        "construction_wire_bytes_per_device": want.wire_bytes_per_device,
    }
