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
from essa_jax.config import (
    ConfigError,
    check_choice,
    check_mesh_model,
    check_positive,
    search_seed,
)
from essa_jax.es import STRATEGIES, SearchError, get_strategy
from essa_jax.mesh import make_mesh
from essa_jax.population import PopulationEvaluator, PromptBatch, essa_generation, text_reward
from essa_jax.train.programs import Program, ProgramInputs, abstract, model_flops
from essa_jax.train.rollouts import init_cursor, next_indices

PROMPT_SAMPLINGS = ("shared", "per_candidate")
# Constructor arguments the loop sets from the run and named config.essa fields; a strategy's
# other arguments come from config.essa.strategy_args.
_RUN_ARGS = ("num_dims", "population_size", "sigma_init", "mirrored", "learning_rate")

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
    flat: jax.Array  # int32 [], generations in a row up to `step` whose candidates all tied


def genome_scale(basis: lora_lib.SVDBasis, layout: lora_lib.GenomeLayout) -> jax.Array:
    """[D] SFT singular values at each genome position (floored per factor)."""
    parts = {}
    for t, f in basis.factors.items():
        parts[t] = {}
        for name, s in (("a", f.s_a), ("b", f.s_b)):
            s = jnp.abs(s[:, : layout.num_free])
            parts[t][name] = jnp.maximum(s, _SCALE_FLOOR * jnp.mean(s) + 1e-12)
    return layout.join(parts)


def genome_layout(config: Any, num_layers: int) -> lora_lib.GenomeLayout:
    """The genome of `config`'s SVD adapters (ESSA Sec. 3.1): every LoRA target, `num_layers`
    layers, lora.rank values per factor of which ceil(essa.alpha * r) are searched. ESSA evolves
    it; SVD-GRPO trains it by gradient (`train.grpo`)."""
    return lora_lib.genome_layout(
        config.lora.targets, num_layers, config.lora.rank, config.essa.alpha
    )


def strategy_kwargs(essa_config: Any, cls: type) -> dict[str, Any]:
    """Constructor arguments of an ES strategy class from `config.essa` (beyond num_dims and
    population_size): sigma_init, `mirrored` when set, `learning_rate` when the class has that
    field, then the strategy's own `strategy_args`."""
    names = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    kw: dict[str, Any] = {"sigma_init": essa_config.sigma_init}
    if essa_config.get("mirrored", False):
        kw["mirrored"] = True
    if "learning_rate" in names:
        kw["learning_rate"] = essa_config.learning_rate
    return {**kw, **dict(essa_config.strategy_args)}


def make_strategy(essa_config: Any, num_dims: int) -> Any:
    """The strategy `config.essa` names, for a search space of `num_dims`."""
    return get_strategy(
        essa_config.strategy,
        num_dims=num_dims,
        population_size=essa_config.population_size,
        **strategy_kwargs(essa_config, STRATEGIES[essa_config.strategy]),
    )


def check_essa_section(config: Any, model_config: Any = None) -> None:
    """`config.essa` (ConfigError naming the first bad field): the strategy is registered, and
    built with the run's arguments and `essa.strategy_args` (its own checks run, before any weight
    is read), the population / prompts / chunking / search-space fields are in range.
    `model_config` (or `model.path`'s header) gives the genome's size when known."""
    e = config.essa
    if e.strategy not in STRATEGIES:
        raise ConfigError(
            "essa.strategy",
            e.strategy,
            " | ".join(map(repr, STRATEGIES)),
            "register a strategy with essa_jax.es.register_strategy in a module the config file "
            "imports",
        )
    if not isinstance(e.population_size, int) or e.population_size < 2:
        raise ConfigError("essa.population_size", e.population_size, "integers >= 2")
    check_choice("essa.prompt_sampling", e.prompt_sampling, PROMPT_SAMPLINGS)
    check_positive("essa.learning_rate", e.learning_rate)
    if e.mirrored and e.strategy != "cma_es":
        raise ConfigError(
            "essa.mirrored", e.mirrored, "False for strategy " + repr(e.strategy),
            "mirrored pairs with pairwise selection are implemented for 'cma_es' "
            "(openai_es is antithetic already)",
        )  # fmt: skip
    if e.mirrored and e.population_size % 2:
        raise ConfigError(
            "essa.population_size", e.population_size, "even sizes with essa.mirrored=True"
        )
    check_positive("essa.prompts_per_candidate", e.prompts_per_candidate)
    check_positive("essa.generations", e.generations)
    if not e.greedy and e.temperature <= 0:  # finite: config.check_finite_fields
        raise ConfigError(
            "essa.temperature",
            e.temperature,
            "finite numbers > 0 when ESSA samples (essa.greedy=False)",
            "a temperature of 0 is greedy decoding: set --config.essa.greedy=True",
        )
    rpc = e.rows_per_chunk
    if isinstance(rpc, bool) or not isinstance(rpc, int) or rpc < 0:
        raise ConfigError(
            "essa.rows_per_chunk", rpc, "integers >= 0 (0 = chosen from device memory)"
        )
    check_positive("essa.sigma_init", e.sigma_init)
    mfg = e.get("max_flat_generations", 0)
    if isinstance(mfg, bool) or not isinstance(mfg, int) or mfg < 0:
        raise ConfigError(
            "essa.max_flat_generations", mfg, "integers >= 0 (0: never stop on tied candidates)"
        )
    if not 0.0 < e.alpha <= 1.0:
        raise ConfigError("essa.alpha", e.alpha, "0 < alpha <= 1")
    if e.alpha * config.lora.rank < 1:
        raise ConfigError(
            "essa.alpha", e.alpha, f">= 1/rank = {1 / config.lora.rank:g} (at least one value)"
        )
    taken = sorted(set(e.strategy_args) & set(_RUN_ARGS))
    if taken:
        raise ConfigError(
            "essa.strategy_args",
            dict(e.strategy_args),
            f"arguments other than {_RUN_ARGS}",
            f"{taken} come from the run or config.essa's own fields",
        )
    layers = model_config.num_layers if model_config is not None else 1
    try:
        make_strategy(e, genome_layout(config, layers).size)
    except (TypeError, ValueError) as err:
        raise ConfigError(
            "essa.strategy_args",
            dict(e.strategy_args),
            f"the constructor arguments of strategy {e.strategy!r}",
            " ".join(str(err).split()),
        ) from None


class ESSALoop:
    """init_state / step / policy for the ESSA method."""

    def __init__(self, run: Any):
        self.run = run
        c = run.config
        self.cfg = c.essa
        self.total_steps = c.essa.generations
        self.layout = genome_layout(c, run.model_config.num_layers)
        self.strategy = make_strategy(c.essa, self.layout.size)
        # One mesh over every process's devices: each device generates its members' rows, each
        # process scores its own rows, and only per-row rewards travel (essa_jax.population). The
        # weights are split over its model axis (tensor parallelism, essa_jax.mesh.param_specs);
        # a checkpoint whose shape validate_config could not read is checked here, once loaded.
        check_mesh_model(c.mesh, jax.device_count(), run.model_config)
        self.mesh = make_mesh(data=c.mesh.data, model=c.mesh.model)
        self.evaluator = population_evaluator(
            c,
            run.infer_params,  # the quantised base when model.quantize is set
            run.model_config,
            self.layout,
            self.mesh,
            text_reward(run.reward_fn, run.tokenizer, run.sampler.eos_token_ids),
            run.sampler.eos_token_ids,
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
            flat=jnp.int32(0),
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
            name=self.cfg.strategy,
        )
        fitness = ev.fitness
        tied = float(np.ptp(fitness)) == 0.0
        flat = int(state.flat) + 1 if tied else 0
        limit = int(self.cfg.get("max_flat_generations", 0))
        if limit and flat >= limit:
            # Every candidate scored the same for `limit` generations: nothing ranked them, so
            # the strategy learned nothing (its tell skipped, or a random walk of its mean).
            raise SearchError(
                f"the search is not searching: the candidates of strategy {self.cfg.strategy!r} "
                f"tied (one fitness for all; the last {float(fitness[0]):g}) in {flat} "
                f"generations in a row up to generation {int(state.step) + 1}, so no ranking "
                "reached the strategy; a reward that separates candidates, more "
                "essa.prompts_per_candidate or a larger essa.sigma_init would, or "
                "essa.max_flat_generations = 0 goes on regardless"
            )
        metrics = {
            "reward": float(np.mean(fitness)),
            "skipped_tell": ev.metrics["skipped_tell"],
            "reward_std": float(np.std(fitness)),
            "reward_max": float(np.max(fitness)),
            "reward_min": float(np.min(fitness)),
            "zero_variance": float(np.ptp(fitness) == 0.0),
            # What the Strategy protocol promises (es/base.py): mean [D], sigma [] or [D]. A
            # per-coordinate sigma logs its mean; the update is the mean's move this generation.
            "sigma": float(jnp.mean(es.sigma)),
            "update_norm": float(jnp.linalg.norm(es.mean - state.es.mean)),
            "mean_norm": float(jnp.linalg.norm(es.mean)),
            "completion_len": ev.metrics["completion_len"],
            "truncated": ev.metrics["truncated"],
            # Completions generated: every candidate answers its prompts (shared or its own).
            "rollouts": self.cfg.population_size * self.cfg.prompts_per_candidate,
        }
        new = state.replace(es=es, step=state.step + 1, cursor=cursor, flat=jnp.int32(flat))
        return new, metrics, int(ev.metrics["tokens"])


def population_evaluator(
    config: Any,
    params: Any,
    model_config: Any,
    layout: lora_lib.GenomeLayout,
    mesh: Any,
    score: Any,
    eos: tuple[int, ...],
    device_memory_bytes: int | None = None,
) -> PopulationEvaluator:
    """The one PopulationEvaluator of `config`'s ESSA run on `mesh`: the loop's (real weights,
    the task's `score`) and the plan's (abstract weights, the target's `device_memory_bytes`, so
    the chunk it picks for essa.rows_per_chunk = 0 is the one the run would pick)."""
    c = config.essa
    return PopulationEvaluator(
        params,
        model_config,
        layout,
        mesh=mesh,
        score=score,
        max_new_tokens=config.generation.max_new_tokens,
        greedy=bool(c.greedy),
        temperature=float(c.temperature),
        eos_token_ids=eos,
        rows_per_chunk=int(c.rows_per_chunk),
        device_memory_bytes=device_memory_bytes,
    )


def population_program(inputs: ProgramInputs) -> Program:
    """`essa_population`: one generation's population program (P x B rows over the run's (pop,
    data, model) mesh on the target's devices), lowered from abstract inputs by the evaluator
    the loop builds (`population_evaluator`)."""
    from jax.sharding import NamedSharding, PartitionSpec

    c, mc, tp = inputs.config, inputs.mc, inputs.prompt_len
    mesh = make_mesh(data=c.mesh.data, model=c.mesh.model, devices=inputs.devices)
    replicated = NamedSharding(mesh, PartitionSpec())
    basis, layout = lora_lib.basis_shape(inputs.lora_shape, float(c.essa.alpha))
    basis = abstract(basis, replicated)
    p, b = int(c.essa.population_size), int(c.essa.prompts_per_candidate)
    shape = (p, b, tp) if c.essa.prompt_sampling == "per_candidate" else (b, tp)
    sizes = dict(zip(mesh.axis_names, mesh.devices.shape, strict=True))
    evaluator = population_evaluator(
        c,
        abstract(inputs.infer_shape, replicated),
        mc,
        layout,
        mesh,
        lambda rows: [],
        inputs.eos,
        inputs.device_memory_bytes,
    )
    tok = jax.ShapeDtypeStruct(shape, jnp.int32, sharding=replicated)
    batch = PromptBatch(tokens=tok, mask=tok, prompts=[])
    genomes = jax.ShapeDtypeStruct((p, layout.size), jnp.float32, sharding=replicated)
    key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=replicated)
    rows = evaluator.shard_rows(p, b)
    fix = (
        "a smaller essa.rows_per_chunk, more devices (--devices), or fewer "
        "essa.prompts_per_candidate"
    )
    try:
        chunk = evaluator.rows_per_chunk_for(basis, genomes, batch) or rows
    except ValueError as e:  # not even one row fits next to the weights
        return Program("essa_population", None, sizes, {"rows_per_device": rows}, str(e))
    return Program(
        "essa_population",
        lambda: evaluator.lower(basis, genomes, batch, key),
        sizes,
        {"rows_per_device": rows, "essa.rows_per_chunk": chunk},
        fix,
        model_flops(mc, rows, tp, inputs.new_tokens),
    )
