"""The GRPO-family loop: GRPO, F-GRPO (focal, arXiv 2602.06717) and SVD-GRPO, from the SFT adapter.

"grpo" / "fgrpo" train both LoRA factors of the SFT adapter; "svdgrpo" (ESSA's baseline, arXiv
2507.04453 Sec. 5) trains, by gradient, exactly the parameters ESSA evolves: the genome of offsets
to the SFT singular values (same SVD, same alpha). Each step samples `grpo.batch_size` rollouts
(`batch_size / group_size` prompts x N) and applies `essa_jax.rl.GRPOTrainer.step`, with the
`essa_jax.rl.GRPOConfig` that `essa_jax.config.grpo_config(config)` derives from the experiment
config: the estimator `grpo.adv_scale` and the weighting `grpo.weighting` by name ("fgrpo" is the
preset weighting "focal" with gamma = grpo.focal_gamma). Which variant runs is the method object's
(`GRPOVariant`, from `essa_jax.train.methods`); this module holds the loop, its section's checks
and the programs the plan compiles (`grpo_programs`, built with the loop's own `grpo_trainer`).

On several devices (or processes) the trainer runs data-parallel on `run.mesh`
(`pipeline.data_parallel_mesh`): the base weights are placed on it once (`rl.place_base`),
rollouts / scoring / updates are sharded over ``data``, each process rewards only its own rows.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from essa_jax import lora as lora_lib
from essa_jax.config import (
    GRPO_CONFIG_FIELDS,
    ConfigError,
    check_positive,
    grpo_config,
    search_seed,
)
from essa_jax.lora.full import TrainedWeights, merge_weights, no_lora
from essa_jax.mesh import host_copy
from essa_jax.rl import (
    FrozenPolicy,
    GRPOConfigError,
    GRPOState,
    GRPOTrainer,
    RolloutBatch,
    get_weighting,
    on_mesh,
    place_base,
)
from essa_jax.train.essa import genome_layout
from essa_jax.train.programs import Program, ProgramInputs, abstract, mesh_sizes, model_flops
from essa_jax.train.rollouts import init_cursor, next_indices

__all__ = ["GRPOLoop", "GRPOLoopState", "GRPOVariant", "grpo_config"]


@dataclasses.dataclass(frozen=True)
class GRPOVariant:
    """What distinguishes the GRPO-family methods: `svd` trains ESSA's genome (SVD-GRPO) instead
    of the LoRA factors; `weighting` (None = `grpo.weighting`) is a preset advantage weighting
    ("focal": F-GRPO, which then needs grpo.focal_gamma > 0)."""

    svd: bool = False
    weighting: str | None = None

    def rl_config(self, config: Any) -> Any:
        """The run's `rl.GRPOConfig` (`config.grpo_config` with this variant's weighting)."""
        return grpo_config(config, weighting=self.weighting)


def check_grpo_section(config: Any, variant: GRPOVariant) -> None:
    """`config.grpo` for `variant` (ConfigError naming the first bad field): the GRPOConfig it
    derives validates itself (estimator and weighting against their registries), the weighting
    runs once on a group of zero rewards with its `grpo.weighting_args` (a user's weighting that
    cannot read its parameters fails here, before any weight is read), and the batch splits into
    groups and mini-batches."""
    g = config.grpo
    check_positive("grpo.steps", g.steps)
    if variant.weighting is not None and g.weighting not in ("none", variant.weighting):
        raise ConfigError(
            "grpo.weighting",
            g.weighting,
            f"'none' or {variant.weighting!r} for method {config.method!r}",
            f"the method is the preset weighting {variant.weighting!r}: use --config.method=grpo "
            "to choose another",
        )
    if variant.weighting is None and g.weighting == "none" and g.focal_gamma != 0:
        raise ConfigError(
            "grpo.focal_gamma", g.focal_gamma, "0 with grpo.weighting='none'",
            "focal weights make it F-GRPO: --config.grpo.weighting=focal, or --config.method=fgrpo",
        )  # fmt: skip
    try:
        cfg = variant.rl_config(config)
    except GRPOConfigError as e:
        field = GRPO_CONFIG_FIELDS.get(e.field, "grpo." + e.field)
        raise ConfigError(field, e.value, e.valid, e.hint) from e
    if cfg.weighting == "focal" and g.focal_gamma == 0:
        raise ConfigError(
            "grpo.focal_gamma", 0.0, "> 0 with the focal weighting (0 is plain GRPO)", "e.g. 0.5"
        )
    try:
        get_weighting(cfg.weighting)(jnp.zeros(2 * cfg.group_size), cfg.group_size, cfg)
    except Exception as e:  # a user's weighting: whatever it raises, it cannot run as set
        raise ConfigError(
            "grpo.weighting_args",
            dict(g.weighting_args),
            f"the parameters weighting {cfg.weighting!r} reads",
            f"{type(e).__name__}: {' '.join(str(e).split())}",
        ) from None
    if not isinstance(g.batch_size, int) or g.batch_size % g.group_size or g.batch_size <= 0:
        raise ConfigError(
            "grpo.batch_size",
            g.batch_size,
            f"positive multiples of grpo.group_size={g.group_size}",
        )
    if g.batch_size % g.num_minibatches:
        raise ConfigError(
            "grpo.num_minibatches",
            g.num_minibatches,
            f"divisors of grpo.batch_size={g.batch_size} (the rollouts of a step)",
        )


def check_grpo_rows(config: Any, variant: GRPOVariant, data: int) -> None:
    """`grpo.micro_batch_size` against the rows each of `data` devices holds of a mini-batch."""
    try:
        variant.rl_config(config).check_batch(int(config.grpo.batch_size), data)
    except GRPOConfigError as e:
        raise ConfigError(f"grpo.{e.field}", e.value, e.valid, e.hint) from e


def grpo_trainer(
    config: Any,
    variant: GRPOVariant,
    model_config: Any,
    to_lora: Any,
    *,
    reward_fn: Any,
    decode: Any,
    eos: tuple[int, ...],
    mesh: Any,
    to_params: Any = None,
) -> GRPOTrainer:
    """The one GRPOTrainer of `config`'s run: the loop's (the task's reward and tokenizer) and the
    plan's (placeholders: nothing is sampled)."""
    return GRPOTrainer(
        model_config,
        variant.rl_config(config),
        to_lora=to_lora,
        reward_fn=reward_fn,
        decode=decode,
        eos_token_ids=eos,
        mesh=mesh,
        to_params=to_params,
    )


@flax.struct.dataclass
class GRPOLoopState:
    """The trainer's state (trainable, optimiser, step, key), the frozen adapter part (the SVD
    basis for svdgrpo, else None) and the data cursor."""

    grpo: GRPOState
    frozen: Any
    cursor: dict[str, jax.Array]

    @property
    def step(self) -> jax.Array:
        return self.grpo.step


class GRPOLoop:
    """init_state / step / policy for the GRPO-family methods."""

    def __init__(self, run: Any, variant: GRPOVariant):
        self.run = run
        c = run.config
        self.total_steps = c.grpo.steps
        self.num_prompts = c.grpo.batch_size // c.grpo.group_size
        self.svd = variant.svd
        self.layout = genome_layout(c, run.model_config.num_layers)
        # The to_lora of the policy init_state builds (genome_policy / lora_policy); the trainer
        # needs it now, before the SFT adapter exists. train.params = "full" / "projections":
        # the weights are trained (lora.full), the base stays the initial weights (KL reference).
        self.full = c.train.params != "lora"
        if self.full:
            self.to_lora = no_lora
        elif self.svd:
            self.to_lora = lora_lib.genome_to_lora(self.layout)
        else:
            self.to_lora = lora_lib.plain_to_lora
        tok = run.tokenizer
        self.trainer = grpo_trainer(
            c,
            variant,
            run.model_config,
            self.to_lora,
            reward_fn=run.reward_fn,
            decode=lambda ids: tok.decode(ids, skip_special_tokens=True),
            eos=run.sampler.eos_token_ids,
            mesh=run.mesh,
            to_params=merge_weights if self.full else None,
        )
        # Placed once: a jitted call would otherwise transfer the weights on every step.
        # The quantised base when model.quantize is set: rollouts, scores and updates all run on
        # it (QLoRA-style: the gradient reaches the adapter through the dequantised kernels), so
        # the policy that samples is the one that is scored (on-policy ratios).
        base = run.infer_params
        if run.mesh is not None:
            base = place_base(base, run.mesh, run.model_config, shard_data=self.full)
        self.base = base

    def init_state(self, key: jax.Array, sft_lora: Any) -> GRPOLoopState:
        if self.full:  # the SFT weights' masters (`pipeline.initial_policy`, `train_sft`)
            trainable, frozen = sft_lora.masters, None
        elif self.svd:
            sft_lora = {t: sft_lora[t] for t in self.layout.targets}
            basis, layout = lora_lib.svd_factorize(sft_lora, self.run.config.essa.alpha)
            assert layout == self.layout, (layout, self.layout)
            trainable, frozen, _ = lora_lib.genome_policy(
                basis, layout, lora_lib.sft_genome(layout)
            )
        else:
            trainable, frozen, _ = lora_lib.lora_policy(sft_lora)
        return GRPOLoopState(
            grpo=self.trainer.init(trainable, key),
            frozen=frozen,
            cursor=init_cursor(len(self.run.train), search_seed(self.run.config) + 2),
        )

    def _local(self, tree: Any) -> Any:
        """A one-device copy of mesh-placed values (held-out evaluation and export run on one
        device); as it is without a mesh."""
        if self.run.mesh is None:
            return tree
        return jax.tree.map(jnp.asarray, host_copy(tree))  # ZeRO state: gathered across processes

    def policy_lora(self, state: GRPOLoopState) -> Any:
        if self.full:
            return TrainedWeights(self._local(state.grpo.params))
        return self.to_lora(self._local(state.grpo.params), self._local(state.frozen))

    def export_lora(self, state: GRPOLoopState) -> Any:
        params, frozen = self._local(state.grpo.params), self._local(state.frozen)
        if self.full:
            return TrainedWeights(params)
        if self.svd:
            return lora_lib.svd_lora_to_lora(frozen, self.layout, params)
        return params

    def step(self, state: GRPOLoopState) -> tuple[GRPOLoopState, dict[str, float], int]:
        run = self.run
        idx, cursor = next_indices(state.cursor, self.num_prompts)
        batch = run.train.take(idx)
        if run.mesh is not None:  # the frozen adapter part (svdgrpo's basis) placed once
            state = state.replace(frozen=on_mesh(state.frozen, run.mesh))
        policy = FrozenPolicy(base=self.base, adapter=state.frozen)
        new, m = self.trainer.step(
            state.grpo,
            policy,
            jnp.asarray(batch.tokens),
            jnp.asarray(batch.mask),
            batch.prompts,
            **batch.fields,
        )
        rollouts = self.num_prompts * self.trainer.cfg.group_size
        tokens = int(round(m["completion_len_mean"] * rollouts))
        metrics = {
            "reward": m.pop("reward_mean"),
            "zero_variance": m.pop("zero_variance_frac"),
            # F-GRPO's diagnostics (arXiv 2602.06717), splitting zero_variance: prompt groups whose
            # every rollout is right (reward >= grpo.r_correct, 1.0 for "arith" / "math") or wrong
            # (<= grpo.r_wrong); `entropy` (kept as is) is the sampling policy's mean token entropy
            # over the completion tokens (`rl.outcomes.step_metrics`).
            "all_right": m.pop("all_right_frac"),
            "all_wrong": m.pop("all_wrong_frac"),
            "completion_len": m.pop("completion_len_mean"),
            "truncated": m.pop("truncation_rate"),
            "rollouts": rollouts,  # completions sampled this step (the pipeline sums them)
            **m,
        }
        return state.replace(grpo=new, cursor=cursor), metrics, tokens


def grpo_programs(inputs: ProgramInputs, variant: GRPOVariant) -> list[Program]:
    """`grpo_rollout`, `grpo_score` (only when old / reference log-probs are needed) and
    `grpo_update`, lowered from abstract inputs by the trainer the loop builds (`grpo_trainer`),
    data-parallel over the run's mesh."""
    from jax.sharding import NamedSharding, PartitionSpec

    from essa_jax.mesh import DATA_AXIS, axis_size, padded_size

    c, mc, rep, mesh = inputs.config, inputs.mc, inputs.rep, inputs.mesh
    tp, new = inputs.prompt_len, inputs.new_tokens
    from essa_jax.lora.adapter import master_weights
    from essa_jax.lora.full import full_policy
    from essa_jax.mesh import place_params

    base = inputs.infer_base
    full = c.train.params != "lora"
    if full:  # the weights' float32 masters; the base split over data too (as GRPOLoop)
        to_lora, frozen = no_lora, None
        trainable = jax.eval_shape(
            lambda p: master_weights(full_policy(p, c.train.params)[0]), base
        )
        if mesh is not None:
            base = place_params(base, mesh, mc, shard_data=True)
    elif variant.svd:
        basis, layout = lora_lib.basis_shape(inputs.lora_shape, float(c.essa.alpha))
        to_lora = lora_lib.genome_to_lora(layout)
        frozen = abstract(basis, rep)
        trainable = jax.ShapeDtypeStruct((layout.size,), jnp.float32, sharding=rep)
    else:
        to_lora, frozen = lora_lib.plain_to_lora, None
        trainable = abstract(inputs.lora_shape, rep)
    trainer = grpo_trainer(
        c, variant, mc, to_lora, reward_fn=lambda *a, **k: [], decode=str, eos=inputs.eos,
        mesh=mesh, to_params=merge_weights if full else None,
    )  # fmt: skip
    cfg = trainer.cfg
    policy = FrozenPolicy(base=base, adapter=frozen)
    opt_state = jax.eval_shape(trainer.optimizer.init, trainable)
    if full:  # ZeRO over data: the run's `GRPOPrograms.place_state`
        t_sh, o_sh = trainer.state_shardings(trainable, opt_state)
        trainable = jax.tree.map(
            lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), trainable, t_sh
        )
        opt_state = jax.tree.map(
            lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), opt_state, o_sh
        )
    else:
        opt_state = abstract(opt_state, rep)
    num_prompts = int(c.grpo.batch_size) // int(c.grpo.group_size)
    rows, seq = int(c.grpo.batch_size), tp + new
    mb = rows // int(c.grpo.num_minibatches)
    data = axis_size(mesh, DATA_AXIS)
    sharded = rep if mesh is None else NamedSharding(mesh, PartitionSpec(DATA_AXIS))
    sizes = mesh_sizes(mesh)

    def arr(shape, dtype=jnp.int32, sharding=rep):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

    def lower_rollout():
        if mesh is None:
            key = arr((2,), jnp.uint32)
        else:  # the sharded step passes a typed key
            key = jax.eval_shape(lambda: jax.random.key(0))
            key = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=rep)
        return trainer.rollout.lower(
            policy, trainable, arr((num_prompts, tp)), arr((num_prompts, tp)), key
        )

    multi_update = cfg.epochs * cfg.num_minibatches > 1
    need_old = multi_update and not cfg.use_generation_logprobs
    need_ref = cfg.beta > 0
    has_old = need_old or cfg.use_generation_logprobs
    mb_pad = padded_size(mb, data)

    def lower_update():
        def rows_of(shape, dtype=jnp.int32):
            return arr((mb_pad, *shape), dtype, sharded)

        batch = RolloutBatch(
            tokens=rows_of((seq,)),
            attention_mask=rows_of((seq,)),
            completion_mask=rows_of((new,), jnp.float32),
            advantages=rows_of((), jnp.float32),
            old_logp=rows_of((new,), jnp.float32) if has_old else None,
            ref_logp=rows_of((new,), jnp.float32) if need_ref else None,
        )
        if mesh is None:
            return trainer.update_step.lower(policy, trainable, opt_state, batch)
        return trainer.update_step.lower(policy, trainable, opt_state, batch, num_rows=mb)

    per_device = padded_size(rows, data) // data
    programs = [
        Program(
            "grpo_rollout",
            lower_rollout,
            sizes,
            {"rollout_rows_per_device": per_device, "grpo.rows_per_chunk": cfg.rows_per_chunk},
            "a smaller grpo.rows_per_chunk, more devices, or a larger mesh.model",
            model_flops(mc, per_device, tp, new),
        )
    ]
    if need_old or need_ref:
        rows_pad = padded_size(rows, data)

        def lower_score():
            return trainer.score.lower(
                policy,
                trainable,
                arr((rows_pad, seq), sharding=sharded),
                arr((rows_pad, seq), sharding=sharded),
                with_policy=need_old,
                with_ref=need_ref,
            )

        programs.append(
            Program(
                "grpo_score",
                lower_score,
                sizes,
                {"score_rows_per_device": per_device},
                "model.remat=True, a smaller grpo.batch_size, or a larger mesh.model",
                model_flops(mc, per_device, seq) * (int(need_old) + int(need_ref)),
            )
        )
    mb_per_device = mb_pad // data
    programs.append(
        Program(
            "grpo_update",
            lower_update,
            sizes,
            {
                "minibatch_rows_per_device": mb_per_device,
                "grpo.micro_batch_size": cfg.micro_batch_size or mb_per_device,
                "sequence": seq,
            },
            "model.remat=True, a smaller grpo.micro_batch_size (rows per device), more "
            "grpo.num_minibatches, or a larger mesh.model",
            model_flops(mc, mb_per_device, seq, train=True, remat=cfg.remat),
        )
    )
    return programs
