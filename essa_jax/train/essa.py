"""The ESSA loop: CMA-ES over the singular values of the SFT adapter (arXiv 2507.04453, Alg. 1).

Per generation t (`essa_jax.population.essa_generation`): ask P points z of the search space, map
them to genomes (singular-value offsets), score every candidate's greedy completions on its
`prompts_per_candidate` training prompts with the `PopulationEvaluator` (one sharded program over
the run's mesh; fitness = mean reward, maximised), then `tell`. The held-out policy is the
distribution mean. The prompts are the same for every candidate of a generation
(`essa.prompt_sampling = "shared"`: candidates are ranked on identical problems) or drawn per
candidate (`"per_candidate"`, the paper's mini-batch per candidate); both come from the run's data
cursor, which is checkpointed, so a resumed run sees the same prompts.

Search space (our choice; the paper does not state sigma_0): the strategy searches z, and the
genome is z * s_SFT (element-wise over the searched singular values): each singular value is
perturbed relative to its own SFT size, s = s_SFT (1 + z). One `sigma_init` then means the same
relative step for every value, whatever the scale of the factors A (rows ~ U(-1/sqrt(in), ...)) and
B (small after a short SFT). CMA-ES still adapts the covariance on top. `ESSALoop.genomes` is the
one place where z becomes a genome.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from essa_jax import lora as lora_lib
from essa_jax.config import check_mesh_model, search_seed
from essa_jax.es import get_strategy
from essa_jax.mesh import make_mesh
from essa_jax.population import PopulationEvaluator, PromptBatch, essa_generation, text_reward
from essa_jax.train.rollouts import init_cursor, next_indices

# Singular values below this fraction of their factor's mean are floored when used as a scale, so
# a (near-)zero value can still move.
_SCALE_FLOOR = 1e-2


@flax.struct.dataclass
class ESSAState:
    """Everything a resumed ESSA run needs: strategy state, frozen SVD basis, PRNG key, counters."""

    es: Any
    basis: lora_lib.SVDBasis
    scale: jax.Array  # [D] genome = z * scale (ESSALoop.genomes)
    key: jax.Array  # uint32 [2]
    step: jax.Array  # int32 [], generations done
    cursor: dict[str, jax.Array]  # essa_jax.data cursor over the training prompts


def genome_scale(basis: lora_lib.SVDBasis, layout: lora_lib.GenomeLayout) -> jax.Array:
    """[D] SFT singular values at each genome position (floored per factor)."""
    parts = {}
    for t, f in basis.factors.items():
        parts[t] = {}
        for name, s in (("a", f.s_a), ("b", f.s_b)):
            s = jnp.abs(s[:, : layout.num_free])
            parts[t][name] = jnp.maximum(s, _SCALE_FLOOR * jnp.mean(s) + 1e-12)
    return layout.join(parts)


def strategy_kwargs(essa_config: Any, cls: type) -> dict[str, Any]:
    """Constructor arguments of an ES strategy class from `config.essa` (beyond num_dims and
    population_size): the fields the class has."""
    names = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    kw: dict[str, Any] = {"sigma_init": essa_config.sigma_init}
    if essa_config.get("mirrored", False):
        kw["mirrored"] = True
    if "learning_rate" in names:
        kw["learning_rate"] = essa_config.learning_rate
    return kw


class ESSALoop:
    """init_state / step / policy for the ESSA method."""

    name = "essa"

    def __init__(self, run: Any):
        from essa_jax.es import STRATEGIES

        self.run = run
        c = run.config
        self.cfg = c.essa
        self.total_steps = c.essa.generations
        r = c.lora.rank
        self.layout = lora_lib.GenomeLayout(
            # Sorted: jax orders dict pytrees by key, so an adapter dict that went through jit or a
            # checkpoint comes back sorted, and the genome layout must match that order.
            targets=tuple(sorted(c.lora.targets)),
            num_layers=run.model_config.num_layers,
            rank=r,
            num_free=lora_lib.num_free_values(r, c.essa.alpha),
        )
        self.strategy = get_strategy(
            c.essa.strategy,
            num_dims=self.layout.size,
            population_size=c.essa.population_size,
            **strategy_kwargs(c.essa, STRATEGIES[c.essa.strategy]),
        )
        # One mesh over every process's devices: each device generates its members' rows, each
        # process scores its own rows, and only per-row rewards travel (essa_jax.population). The
        # weights are split over its model axis (tensor parallelism, essa_jax.mesh.param_specs);
        # a checkpoint whose shape validate_config could not read is checked here, once loaded.
        check_mesh_model(c.mesh, jax.device_count(), run.model_config)
        self.mesh = make_mesh(data=c.mesh.data, model=c.mesh.model)
        self.evaluator = PopulationEvaluator(
            run.infer_params,  # the quantised base when model.quantize is set
            run.model_config,
            self.layout,
            mesh=self.mesh,
            score=text_reward(run.reward_fn, run.tokenizer, run.sampler.eos_token_ids),
            max_new_tokens=c.generation.max_new_tokens,
            greedy=bool(c.essa.greedy),
            temperature=float(c.essa.temperature),
            eos_token_ids=run.sampler.eos_token_ids,
            rows_per_chunk=int(c.essa.rows_per_chunk),
        )

    # -- state -------------------------------------------------------------------------------
    def init_state(self, key: jax.Array, sft_lora: dict) -> ESSAState:
        sft_lora = {t: sft_lora[t] for t in self.layout.targets}
        basis, layout = lora_lib.svd_factorize(sft_lora, self.cfg.alpha)
        assert layout == self.layout, (layout, self.layout)
        k_init, k_run = jax.random.split(key)
        es = self.strategy.init(k_init, jnp.zeros((self.layout.size,), jnp.float32))
        return ESSAState(
            es=es,
            basis=basis,
            scale=genome_scale(basis, self.layout),
            key=k_run,
            step=jnp.int32(0),
            cursor=init_cursor(len(self.run.train), search_seed(self.run.config) + 1),
        )

    @staticmethod
    def genomes(state: ESSAState, z: jax.Array) -> jax.Array:
        """Search points z `[..., D]` -> genomes (offsets to the SFT singular values)."""
        return z * state.scale

    def policy_lora(self, state: ESSAState) -> dict:
        """The mean genome as model adapters (for evaluation)."""
        return lora_lib.genome_to_svd_lora(
            state.basis, self.layout, self.genomes(state, state.es.mean)
        )

    def export_lora(self, state: ESSAState) -> dict:
        """The mean genome as dense PEFT factors."""
        return lora_lib.svd_lora_to_lora(
            state.basis, self.layout, self.genomes(state, state.es.mean)
        )

    # -- one generation ----------------------------------------------------------------------
    def prompt_batch(self, cursor: dict) -> tuple[PromptBatch, dict]:
        """The generation's prompts and the advanced cursor: B shared prompts, or P x B (each
        candidate its own B, consecutive in the shuffled epoch order) per candidate."""
        b, p = self.cfg.prompts_per_candidate, self.cfg.population_size
        per_candidate = self.cfg.get("prompt_sampling", "shared") == "per_candidate"
        idx, cursor = next_indices(cursor, p * b if per_candidate else b)
        data = self.run.train.take(idx)
        if not per_candidate:
            return PromptBatch(data.tokens, data.mask, data.prompts, data.fields), cursor

        def split(values: list) -> list[list]:
            return [list(values[i * b : (i + 1) * b]) for i in range(p)]

        return (
            PromptBatch(
                data.tokens.reshape(p, b, -1),
                data.mask.reshape(p, b, -1),
                split(data.prompts),
                {k: split(v) for k, v in data.fields.items()},
            ),
            cursor,
        )

    def step(self, state: ESSAState) -> tuple[ESSAState, dict[str, float], int]:
        batch, cursor = self.prompt_batch(state.cursor)

        def evaluate(z: jax.Array, key: jax.Array):
            return self.evaluator(state.basis, self.genomes(state, z), batch, key)

        es, ev = essa_generation(
            self.strategy,
            state.es,
            jax.random.fold_in(state.key, state.step),
            evaluate,
            skip_flat=bool(self.cfg.skip_flat),
        )
        fitness = ev.fitness
        metrics = {
            "reward": float(np.mean(fitness)),
            "skipped_tell": ev.metrics["skipped_tell"],
            "reward_std": float(np.std(fitness)),
            "reward_max": float(np.max(fitness)),
            "reward_min": float(np.min(fitness)),
            "zero_variance": float(np.ptp(fitness) == 0.0),
            "sigma": float(es.sigma),
            "update_norm": float(es.update_norm),
            "mean_norm": float(jnp.linalg.norm(es.mean)),
            "completion_len": ev.metrics["completion_len"],
            "truncated": ev.metrics["truncated"],
        }
        new = state.replace(es=es, step=state.step + 1, cursor=cursor)
        return new, metrics, int(ev.metrics["tokens"])
