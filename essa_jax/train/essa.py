"""The ESSA loop: CMA-ES over the singular values of the SFT adapter (arXiv 2507.04453, Alg. 1).

Per generation t: every candidate of `ask` is scored on the same `prompts_per_candidate` training
prompts (common random numbers: candidates are ranked on identical problems), fitness = mean reward
(maximised), then `tell`. The held-out policy is the distribution mean.

Search space (our choice; the paper does not state sigma_0): the strategy searches z with the
genome = z * s_SFT (element-wise, over the searched singular values), i.e. each singular value is
perturbed relative to its own SFT size, s = s_SFT (1 + z). One `sigma_init` then means the same
relative step for every value, whatever the scale of the factors A (rows ~ U(-1/sqrt(in), ...)) and
B (small after a short SFT). CMA-ES still adapts the covariance on top.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from essa_jax import lora as lora_lib
from essa_jax.es import get_strategy
from essa_jax.train.rollouts import batch_indices, decode_completions, score

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
    cursor: jax.Array  # int32 [], training prompts consumed


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
            cursor=jnp.int32(0),
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
        b = cfg.prompts_per_candidate
        idx = batch_indices(run.config.seed + 1, int(state.cursor), b, len(run.train))
        batch = run.train.take(idx)
        fitness, tokens, extra = self.evaluate(state, z, batch, k_gen)
        es = self.strategy.tell(state.es, z, jnp.asarray(fitness))
        new = state.replace(es=es, step=state.step + 1, cursor=state.cursor + b)
        metrics = {
            "reward": float(np.mean(fitness)),
            "reward_std": float(np.std(fitness)),
            "reward_max": float(np.max(fitness)),
            "reward_min": float(np.min(fitness)),
            "zero_variance": float(np.ptp(fitness) == 0.0),
            "sigma": float(es.sigma),
            "update_norm": float(es.update_norm),
            "mean_norm": float(jnp.linalg.norm(es.mean)),
            **extra,
        }
        return new, metrics, tokens

    def evaluate(self, state: ESSAState, z: jax.Array, batch, key: jax.Array):
        """Fitness [P] of the candidates z [P, D] on `batch` (B prompts), tokens generated."""
        run, cfg = self.run, self.cfg
        p, b = z.shape[0], len(batch)
        out = _population_generate(
            run.params,
            state.basis,
            z * state.scale,
            jnp.asarray(batch.tokens),
            jnp.asarray(batch.mask),
            key,
            sampler=run.sampler,
            layout=self.layout,
            greedy=bool(cfg.greedy),
            temperature=float(cfg.temperature),
        )
        lengths = np.asarray(out.lengths)
        completions = decode_completions(run.tokenizer, np.asarray(out.tokens), lengths)
        rep = batch.take(np.tile(np.arange(b), p))  # member-major rows
        rewards = score(run.reward_fn, rep, completions).reshape(p, b)
        extra = {
            "completion_len": float(lengths.mean()),
            "truncated": float(1.0 - np.asarray(out.finished).mean()),
        }
        return rewards.mean(axis=1), int(lengths.sum()), extra


@functools.partial(jax.jit, static_argnames=("sampler", "layout", "greedy", "temperature"))
def _population_generate(
    params, basis, genomes, tokens, mask, key, *, sampler, layout, greedy, temperature
):
    """All P members on the same B prompts as one batch of P*B rows (shared base weights)."""
    p, b = genomes.shape[0], tokens.shape[0]
    lora = lora_lib.population_svd_lora(basis, layout, genomes, b)
    rows = jnp.tile(tokens, (p, 1))
    rows_mask = jnp.tile(mask, (p, 1))
    return sampler(params, rows, rows_mask, key, lora=lora, greedy=greedy, temperature=temperature)
