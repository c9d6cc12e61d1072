"""The ESSA loop: CMA-ES over the singular values of the SFT adapter (arXiv 2507.04453, Alg. 1).

Per generation t: every candidate of `ask` is scored on the same `prompts_per_candidate` training
prompts (common random numbers: candidates are ranked on identical problems), fitness = mean reward
(maximised, `essa_jax.population.evaluate_population`), then `tell`. The held-out policy is the
distribution mean.

Search space (our choice; the paper does not state sigma_0): the strategy searches z with the
genome = z * s_SFT (element-wise over the searched singular values), i.e. each singular value is
perturbed relative to its own SFT size, s = s_SFT (1 + z). One `sigma_init` then means the same
relative step for every value, whatever the scale of the factors A (rows ~ U(-1/sqrt(in), ...)) and
B (small after a short SFT). CMA-ES still adapts the covariance on top.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from essa_jax import lora as lora_lib
from essa_jax.distributed import allgather_fitness
from essa_jax.es import get_strategy
from essa_jax.es.distributed import evaluate_across_processes
from essa_jax.population import evaluate_population, make_population_mesh, replicate
from essa_jax.train.rollouts import init_cursor, next_indices

# Singular values below this fraction of their factor's mean are floored when used as a scale, so
# a (near-)zero value can still move.
_SCALE_FLOOR = 1e-2


@flax.struct.dataclass
class ESSAState:
    """Everything a resumed ESSA run needs: strategy state, frozen SVD basis, PRNG key, counters."""

    es: Any
    basis: lora_lib.SVDBasis
    scale: jax.Array  # [D] genome = z * scale
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


class ESSALoop:
    """init_state / step / policy for the ESSA method."""

    name = "essa"

    def __init__(self, run: Any):
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
            sigma_init=c.essa.sigma_init,
            **({"mirrored": True} if c.essa.get("mirrored", False) else {}),
        )
        # This process's devices only: with several processes each evaluates its own members
        # (evaluate_across_processes), and evaluate_population reads its outputs on the host.
        shards = c.essa.population_devices or jax.local_device_count()
        local = jax.local_devices()
        self.mesh = make_population_mesh(pop=shards, data=1, devices=local) if shards > 1 else None
        self.params = replicate(run.params, self.mesh) if self.mesh is not None else run.params

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
            cursor=init_cursor(len(self.run.train), self.run.config.seed + 1),
        )

    def policy_lora(self, state: ESSAState) -> dict:
        """The mean genome as model adapters (for evaluation)."""
        return lora_lib.genome_to_svd_lora(state.basis, self.layout, state.es.mean * state.scale)

    def export_lora(self, state: ESSAState) -> dict:
        """The mean genome as dense PEFT factors."""
        return lora_lib.svd_lora_to_lora(state.basis, self.layout, state.es.mean * state.scale)

    # -- one generation ----------------------------------------------------------------------
    def step(self, state: ESSAState) -> tuple[ESSAState, dict[str, float], int]:
        run, cfg = self.run, self.cfg
        key = jax.random.fold_in(state.key, state.step)
        k_ask, k_gen = jax.random.split(key)
        z = self.strategy.ask(k_ask, state.es)
        idx, cursor = next_indices(state.cursor, cfg.prompts_per_candidate)
        batch = run.train.take(idx)
        local_evals = []
        if jax.process_count() > 1 and not cfg.greedy:
            # The engine keys sampling by the local member index; fold in this process's first
            # member so processes draw different samples (the draws then depend on the process
            # count, unlike greedy fitness).
            p, n = z.shape[0], jax.process_count()
            k_gen = jax.random.fold_in(k_gen, jax.process_index() * -(-p // n))

        def evaluate(zs: jax.Array) -> np.ndarray:
            ev = evaluate_population(
                self.params,
                run.model_config,
                state.basis,
                self.layout,
                zs * state.scale,
                batch.tokens,
                batch.mask,
                # A typed key: population_generate's per-row fold_in reshape assumes one (a raw
                # uint32 [2] key fails there when sampling).
                jax.random.wrap_key_data(k_gen),
                prompts=batch.prompts,
                reward_fn=run.reward_fn,
                decode=run.tokenizer,
                task_fields=batch.fields,
                max_new_tokens=run.config.generation.max_new_tokens,
                greedy=bool(cfg.greedy),
                temperature=float(cfg.temperature),
                eos_token_ids=run.sampler.eos_token_ids,
                mesh=self.mesh,
            )
            local_evals.append(ev)
            return ev.fitness

        # ESSA Sec. 3: each process scores its shard of the shared population; only the [P]
        # fitness (and three rollout statistics below) cross process boundaries.
        fitness = np.asarray(evaluate_across_processes(evaluate, z))
        ev = local_evals[0]
        stats = np.asarray(
            [
                ev.metrics["completion_len"],
                ev.metrics["truncated"],
                np.asarray(ev.generation.lengths).sum(),
            ],
            np.float64,
        )
        stats = allgather_fitness(stats).reshape(-1, 3)
        # Equal fitness carries no ranking: CMA-ES would still move the mean (ties broken by
        # index), a random walk of sigma * ||z|| / sqrt(mu_eff) per generation. Keep the state.
        flat = bool(cfg.skip_flat) and float(np.ptp(fitness)) == 0.0
        es = state.es if flat else self.strategy.tell(state.es, z, jnp.asarray(fitness))
        new = state.replace(es=es, step=state.step + 1, cursor=cursor)
        metrics = {
            "reward": float(np.mean(fitness)),
            "skipped_tell": float(flat),
            "reward_std": float(np.std(fitness)),
            "reward_max": float(np.max(fitness)),
            "reward_min": float(np.min(fitness)),
            "zero_variance": float(np.ptp(fitness) == 0.0),
            "sigma": float(es.sigma),
            "update_norm": float(es.update_norm),
            "mean_norm": float(jnp.linalg.norm(es.mean)),
            "completion_len": float(np.mean(stats[:, 0])),
            "truncated": float(np.mean(stats[:, 1])),
        }
        return new, metrics, int(stats[:, 2].sum())
