"""The GRPO-family training step: rollouts, rewards, (focal) advantages, optax updates.

One step (GRPO, arXiv 2402.03300, Alg. 1; F-GRPO, arXiv 2602.06717):
  1. rollouts: each prompt repeated `group_size` times (groups contiguous) and sampled with the
     current adapter (`essa_jax.models.generate`, temperature T);
  2. rewards from a host function `reward_fn(prompts, completions, **task_fields) -> list[float]`;
  3. advantages: `compute_advantages` = the estimator `cfg.advantage` (`essa_jax.rl.advantage`:
     "group" = GRPO) times the weighting `cfg.weighting` (`essa_jax.rl.weighting`: "focal" =
     F-GRPO's (1 - mu)^gamma per prompt group, applied to the advantages before the loss);
  4. old log-probs (the behaviour policy) and, when beta > 0, reference log-probs: the *base model
     with the adapter disabled* (lora=None), so no second copy of the weights exists;
  5. `epochs` passes of `num_minibatches` AdamW updates, each one jitted call of
     `update_step(policy, trainable, opt_state, batch)`.

What is trained is decided by the caller through two inputs, so GRPO on a LoRA and the ESSA paper's
SVD-GRPO baseline (gradients on the singular values only, U and V frozen) share all the code:
  * `trainable`: the pytree the optimiser updates (LoRA dict, singular values, or a genome);
  * `to_lora(trainable, frozen_adapter) -> {target: adapter}`: the model's LoRA hook argument.
`essa_jax.lora.policies` (`lora_policy`, `svd_policy`, `genome_policy`) builds the standard choices;
this module knows nothing of them (the default `to_lora` passes `trainable` through as the LoRA).

Old log-probs: by default they are recomputed with a teacher-forced pass (`sequence_logprobs`), the
same code path as the training log-probs, so at the first update the ratio is exactly 1. The
sampler's own log-probs (KV-cache decode) agree only to float rounding (~1e-6 in float32; more in
bf16), so they are used only with `use_generation_logprobs=True`. When the batch is used for exactly
one update (epochs = num_minibatches = 1) the policy that sampled is the one being differentiated,
so old_logp = stop_gradient(logp) and the extra forward pass is skipped (as TRL does).

State = `GRPOState(params, opt_state, step, key)`, a pytree: checkpoint it and a resumed run is
bit-identical. Rewards are maximised; the loss is minimised.

Data parallelism (`mesh=`, docs/ARCHITECTURE.md, "Data-parallel GRPO and SFT"): on a mesh of
`essa_jax.mesh.make_mesh(pop=1, data=d, model=m)` over every process's devices, the rollouts,
scoring passes and updates run as `jax.shard_map` over ``data`` (``model`` stays Auto): each device
generates, scores and differentiates its block of rows, the trainable / optimiser state stay
replicated, and one psum per update adds the gradients. Row r samples with fold_in(key, r)
whatever the layout, so 1 device, d devices and several processes draw the same rollouts. Each
process reads back and rewards only its own rows; the per-row rewards, lengths and finished flags
are all-gathered, so every process computes the same advantages and the same update. Without a
mesh (the default) everything runs as before on one device.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from essa_jax.lora.adapter import master_weights
from essa_jax.mesh import DATA_AXIS, axis_size, pad_to, padded_size, place, place_params
from essa_jax.models.config import ModelConfig
from essa_jax.models.generate import Generation, generate, generate_chunked
from essa_jax.models.logprobs import sequence_logprobs
from essa_jax.models.tokenizer import decode_completions
from essa_jax.rl.advantage import _grouped, get_estimator, zero_variance_fraction
from essa_jax.rl.config import GRPOConfig
from essa_jax.rl.losses import combine_micro_batch_aux, micro_batch_weights, policy_loss
from essa_jax.rl.weighting import get_weighting

ToLora = Callable[[Any, Any], Mapping[str, Any] | None]
RewardFn = Callable[..., Sequence[float]]


@flax.struct.dataclass
class GRPOState:
    """Everything that changes during training (a pytree; checkpoint / resume it as is).

    params: the trainable pytree; opt_state: the optax state; step: int32 scalar;
    key: raw PRNG key data (uint32 [2]), split once per step.
    """

    params: Any
    opt_state: Any
    step: jax.Array
    key: jax.Array


@flax.struct.dataclass
class FrozenPolicy:
    """What the optimiser does not touch: base weights and the frozen part of the adapter."""

    base: Any
    adapter: Any = None


@flax.struct.dataclass
class RolloutBatch:
    """One optimisation batch of B = prompts x group_size rollouts (Tp prompt, N new tokens).

    tokens [B, Tp + N] (left-padded prompt, then completion); attention_mask [B, Tp + N];
    completion_mask [B, N] float (1 = sampled token, EOS included); advantages [B];
    old_logp [B, N] or None (on-policy: the current log-probs, detached); ref_logp [B, N] or None.
    """

    tokens: jax.Array
    attention_mask: jax.Array
    completion_mask: jax.Array
    advantages: jax.Array
    old_logp: jax.Array | None = None
    ref_logp: jax.Array | None = None


def _plain_to_lora(trainable: Any, frozen_adapter: Any) -> Mapping[str, Any]:
    """The default `to_lora`: `trainable` is the LoRA dict itself."""
    del frozen_adapter
    return trainable


# ----------------------------------------------------------------------------- building blocks


def make_optimizer(cfg: GRPOConfig) -> optax.GradientTransformation:
    """AdamW with global-norm gradient clipping (F-GRPO paper: lr 1e-6, wd 0.01, clip 1.0)."""
    return optax.chain(
        optax.clip_by_global_norm(cfg.max_grad_norm),
        optax.adamw(
            cfg.learning_rate,
            b1=cfg.adam_b1,
            b2=cfg.adam_b2,
            eps=cfg.adam_eps,
            weight_decay=cfg.weight_decay,
        ),
    )


def compute_advantages(rewards: jax.Array, cfg: GRPOConfig) -> tuple[jax.Array, jax.Array]:
    """(weights * advantages, weights) per rollout, `[B]` each.

    advantages = `get_estimator(cfg.advantage)(rewards, cfg.group_size, cfg)` and weights =
    `get_weighting(cfg.weighting)(rewards, cfg.group_size, cfg)`, both looked up by name in their
    registries (`essa_jax.rl.advantage`, `essa_jax.rl.weighting`): registering a new estimator or
    weighting (e.g. a group filter) needs no change here. The weighting is F-GRPO's separate
    transform: it scales the advantages per prompt group before the loss (weights are 1 with
    weighting "none"), and is a constant for the optimiser.
    """
    adv = get_estimator(cfg.advantage)(rewards, cfg.group_size, cfg)
    weights = jax.lax.stop_gradient(get_weighting(cfg.weighting)(rewards, cfg.group_size, cfg))
    return weights * adv, weights


def group_outcome_fractions(
    rewards: jax.Array, group_size: int, r_correct: float = 1.0, r_wrong: float = 0.0
) -> tuple[jax.Array, jax.Array]:
    """(all-right fraction, all-wrong fraction) of a step's prompt groups: F-GRPO's diagnostics
    (arXiv 2602.06717) of how many groups the policy already always solves / never solves.

    A rollout is *right* when its reward is at least `r_correct` (the reward at its maximum: 1.0
    for the binary rewards "arith" / "math") and *wrong* when it is at most `r_wrong` (0.0); a
    group is all-right (all-wrong) when every one of its rollouts is. These are exactly the groups
    whose focal success rate mu (`rl.weighting.success_rate`, same `r_correct` / `r_wrong`) is 1
    (0) when rewards lie in [r_wrong, r_correct]. With a binary reward the two fractions add up to
    `zero_variance_fraction` (a group with equal rewards is all right or all wrong); with a graded
    reward (e.g. "char_match") equal partial rewards count in neither.

    rewards: [num_prompts * group_size], each prompt's group contiguous. Returns two float32
    scalars in [0, 1].
    """
    grouped = _grouped(rewards, group_size)
    all_right = jnp.all(grouped >= r_correct, axis=1)
    all_wrong = jnp.all(grouped <= r_wrong, axis=1)
    return (
        jnp.mean(all_right.astype(jnp.float32)),
        jnp.mean(all_wrong.astype(jnp.float32)),
    )


# ----------------------------------------------------------------------------- data parallelism


def place_base(params: Any, mesh: Mesh, model_config: ModelConfig) -> Any:
    """Base weights on `mesh` for the data-parallel GRPO / SFT programs, once per run: split over
    the ``model`` axis (tensor parallel, `essa_jax.mesh.place_params`) and replicated over
    ``data``. The programs are manual over ``data`` only and keep ``model`` Auto, so XLA runs the
    layers tensor-parallel from the weights' shardings (docs/ARCHITECTURE.md, "Tensor
    parallelism")."""
    return place_params(params, mesh, model_config)


def on_mesh(tree: Any, mesh: Mesh) -> Any:
    """`tree` as global arrays on `mesh`: leaves already spread over exactly the mesh's devices
    (replicated, or split over ``model`` by `place_base`) are kept, others are placed replicated
    (`mesh.place`: every process holds them identically, nothing travels)."""
    devices = set(mesh.devices.flat)

    def put(x: Any) -> Any:
        if isinstance(x, jax.Array) and x.sharding.device_set == devices:
            return x
        return place(x, mesh)

    return jax.tree.map(put, tree)


def row_keys(key: jax.Array, num_rows: int) -> jax.Array:
    """Raw per-row sampling keys uint32 [R, 2]: row r gets fold_in(key, r), the keys of
    `models.generate_chunked`, so a row's tokens depend neither on the chunk nor on the device
    (or process) that generates it."""
    if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(key)
    keys = jax.vmap(jax.random.fold_in, (None, 0))(key, jnp.arange(num_rows, dtype=jnp.int32))
    return jax.random.key_data(keys)


def local_rows(gen: Generation, num_rows: int) -> tuple[np.ndarray, Generation]:
    """The rows of a data-sharded generation [R_pad, ...] that this process's devices hold.

    Returns (row indices [n] ascending, the `Generation` of those rows as numpy): one block per
    replica-0 shard (a block held on several devices, e.g. over ``model``, is read once), clipped
    to the R real rows (padding rows are dropped). Like `population.evaluator._local_blocks`.
    """
    names = ("tokens", "lengths", "logprobs", "mask", "finished")
    blocks = []
    for group in zip(*(getattr(gen, n).addressable_shards for n in names), strict=True):
        if group[0].replica_id != 0:
            continue
        r0, r1, _ = group[0].index[0].indices(gen.lengths.shape[0])
        r1 = min(r1, num_rows)
        if r0 < r1:
            blocks.append((r0, [np.asarray(sh.data)[: r1 - r0] for sh in group]))
    blocks.sort(key=lambda b: b[0])
    if not blocks:  # this process's devices hold padding only
        rows = np.zeros(0, np.int64)
        fields = [np.zeros((0,) + getattr(gen, n).shape[1:], getattr(gen, n).dtype) for n in names]
    else:
        rows = np.concatenate([np.arange(r0, r0 + len(d[1])) for r0, d in blocks])
        fields = [np.concatenate([d[i] for _, d in blocks]) for i in range(len(names))]
    return rows, Generation(**dict(zip(names, fields, strict=True)))


def allgather_rows(values: np.ndarray, rows: np.ndarray, num_rows: int) -> np.ndarray:
    """Per-row values [k, n] of this process's `rows` -> [k, R] for every row, on every process.

    Each row is filled by exactly one process (its replica-0 holder); a few floats per rollout
    cross processes (`multihost_utils.process_allgather`), never tokens. Like
    `population.evaluator._allgather_owned`.
    """
    grid = np.zeros((values.shape[0] + 1, num_rows), np.float32)
    grid[:-1, rows] = values
    grid[-1, rows] = 1.0
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        every = np.asarray(multihost_utils.process_allgather(grid, tiled=False))
    else:
        every = grid[None]
    owned = every[:, -1:] > 0
    if not np.all(owned.sum(axis=0) == 1):
        raise RuntimeError("rollout rows were rewarded by none or several processes")
    return np.where(owned, every[:, :-1], 0.0).sum(axis=0)


class GRPOTrainer:
    """Compiled GRPO-family step for one model config, `GRPOConfig` and parameterisation.

    Holds no training state (that is `GRPOState`); it holds the jitted functions, built once.

    Args:
      model_config: the model's `ModelConfig`.
      cfg: `GRPOConfig`.
      to_lora: `(trainable, frozen_adapter) -> {target: adapter}` (see `essa_jax.lora.policies`);
        default: `trainable` is the LoRA dict.
      reward_fn: host reward `fn(prompts, completions, **task_fields) -> list[float]`, maximised.
      decode: token ids -> text of a completion (EOS already stripped).
      optimizer: optax transformation; default `make_optimizer(cfg)`.
      eos_token_ids: end-of-sequence ids for generation (default: the model config's).
      mesh: run data-parallel over this mesh's ``data`` axis (`essa_jax.mesh.make_mesh(pop=1,
        data=d, model=m)`, every process's devices; see the module docstring); None = one
        device, as before. With a mesh, `rollout`, `score` and `update_step` are the sharded
        programs (rows sharded over ``data``, padded to it by `essa_jax.mesh.pad_to`), and
        `update_step` takes `num_rows` (static: the real rows of the batch, the rest padding).
    """

    def __init__(
        self,
        model_config: ModelConfig,
        cfg: GRPOConfig,
        *,
        to_lora: ToLora = _plain_to_lora,
        reward_fn: RewardFn,
        decode: Callable[[list[int]], str],
        optimizer: optax.GradientTransformation | None = None,
        eos_token_ids: Sequence[int] | None = None,
        mesh: Mesh | None = None,
    ):
        self.model_config = model_config
        self.cfg = cfg
        self.to_lora = to_lora
        self.reward_fn = reward_fn
        self.decode = decode
        self.optimizer = optimizer or make_optimizer(cfg)
        self.eos_token_ids = tuple(
            model_config.eos_token_ids if eos_token_ids is None else eos_token_ids
        )
        self.mesh = mesh
        self.data = axis_size(mesh, DATA_AXIS)
        score_static = ("with_policy", "with_ref", "last")
        # No buffer donation: a caller may keep the old state (e.g. to retry or compare a step).
        if mesh is None:
            self.rollout = jax.jit(self._rollout)
            self.score = jax.jit(self._score, static_argnames=score_static)
            self.update_step = jax.jit(self._update_step)
        else:
            self.rollout = jax.jit(self._rollout_sharded)
            self.score = jax.jit(self._score_sharded, static_argnames=score_static)
            self.update_step = jax.jit(self._update_step_sharded, static_argnames=("num_rows",))
            rows = NamedSharding(mesh, P(DATA_AXIS))
            self._assemble = jax.jit(self._assemble_batch, out_shardings=rows)
            self._take = jax.jit(self._take_rows, out_shardings=rows)

    # -- state

    def init(self, trainable: Any, key: jax.Array) -> GRPOState:
        """Initial state; `key` may be a typed key or raw key data.

        The trainable and the optimiser state are float32 masters (`lora.master_weights`: bfloat16
        leaves are upcast) whatever the model dtype; the adapters cast to the activations' dtype
        at use. Abstract state for a planner: `jax.eval_shape(self.init, trainable, key)`.
        """
        if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
            key = jax.random.key_data(key)
        trainable = master_weights(trainable)
        return GRPOState(
            params=trainable,
            opt_state=self.optimizer.init(trainable),
            step=jnp.zeros((), jnp.int32),
            key=jnp.asarray(key),
        )

    # -- jitted pieces

    def _rollout(
        self,
        policy: FrozenPolicy,
        trainable: Any,
        prompt_tokens: jax.Array,
        prompt_mask: jax.Array,
        key: jax.Array,
    ) -> Generation:
        """group_size completions per prompt: rows [P * N], each prompt's group contiguous.

        cfg.rows_per_chunk > 0 generates them in chunks of that many rows (one chunk's KV cache
        live at a time), row r sampled with fold_in(key, r): the same rollouts for every chunk
        size. 0 = one batch sampled with the one key (`models.generate`; other samples).
        """
        cfg = self.cfg
        tokens = jnp.repeat(prompt_tokens, cfg.group_size, axis=0)
        mask = jnp.repeat(prompt_mask, cfg.group_size, axis=0)
        settings = dict(
            max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            top_k=cfg.top_k,
            top_p=cfg.top_p,
            lora=self.to_lora(trainable, policy.adapter),
            eos_token_ids=self.eos_token_ids,
        )
        if not cfg.rows_per_chunk:
            return generate(policy.base, self.model_config, tokens, mask, key, **settings)
        return generate_chunked(
            policy.base,
            self.model_config,
            tokens,
            mask,
            key,
            rows_per_chunk=cfg.rows_per_chunk,
            **settings,
        )

    def _score(
        self,
        policy: FrozenPolicy,
        trainable: Any,
        tokens: jax.Array,
        attention_mask: jax.Array,
        with_policy: bool = True,
        with_ref: bool = False,
        last: int | None = None,
    ) -> tuple[jax.Array | None, jax.Array | None]:
        """(policy, reference) log-probs [B, T-1] of `tokens` ([B, last] of its final `last`
        targets: the completion); the reference is the base model with the adapter disabled
        (lora=None)."""
        out = []
        for on, lora in ((with_policy, self.to_lora(trainable, policy.adapter)), (with_ref, None)):
            if not on:
                out.append(None)
                continue
            out.append(
                sequence_logprobs(
                    policy.base,
                    self.model_config,
                    tokens,
                    attention_mask,
                    lora=lora,
                    temperature=self.cfg.temperature,
                    remat=self.cfg.remat,
                    last=last,
                )
            )
        return out[0], out[1]

    def loss(
        self, policy: FrozenPolicy, trainable: Any, batch: RolloutBatch
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The policy loss of `batch` under `trainable` (to be minimised) and its diagnostics."""
        cfg = self.cfg
        num_new = batch.completion_mask.shape[1]
        lp, ent = sequence_logprobs(
            policy.base,
            self.model_config,
            batch.tokens,
            batch.attention_mask,
            lora=self.to_lora(trainable, policy.adapter),
            temperature=cfg.temperature,
            return_entropy=True,
            remat=cfg.remat,
            last=num_new,  # the head and its softmax run on the completion positions only
        )
        old = jax.lax.stop_gradient(lp) if batch.old_logp is None else batch.old_logp
        return policy_loss(
            lp,
            old,
            batch.advantages,
            batch.completion_mask,
            kind=cfg.loss,
            eps_low=cfg.eps_low,
            eps_high=cfg.eps_high,
            agg=cfg.agg,
            max_len=cfg.norm_len,
            ref_logp=batch.ref_logp,
            beta=cfg.beta,
            entropy=ent,
        )

    def loss_and_grad(
        self, policy: FrozenPolicy, trainable: Any, batch: RolloutBatch
    ) -> tuple[tuple[jax.Array, dict[str, jax.Array]], Any]:
        """((loss, aux), d loss / d trainable) of a mini-batch of B rollouts.

        cfg.micro_batch_size = 0 (or B): one pass. Else gradient accumulation: the B rows split
        into B / micro_batch_size contiguous micro-batches under `lax.scan` (one micro-batch's
        activations alive at a time), whose losses and gradients add with the weights of
        `micro_batch_weights`, so that every aggregation keeps the mini-batch's normaliser
        (token_mean: its token count; the sequence means: its row count). The update equals the
        whole-batch one up to summation order; aux is `combine_micro_batch_aux`'s.
        """
        grad_fn = jax.value_and_grad(self.loss, argnums=1, has_aux=True)
        B = batch.tokens.shape[0]
        mbs = self.cfg.micro_batch_size
        if not mbs or mbs == B:
            return grad_fn(policy, trainable, batch)
        self.cfg.check_micro_batch(B)
        n = B // mbs
        micro = jax.tree.map(lambda x: x.reshape(n, mbs, *x.shape[1:]), batch)
        weights = micro_batch_weights(micro.completion_mask, self.cfg.agg)  # [n]

        def one(acc, xs):
            mb, w = xs
            (loss, aux), g = grad_fn(policy, trainable, mb)
            acc = jax.tree.map(lambda a, gi: a + w.astype(gi.dtype) * gi, acc, g)
            return acc, (loss, aux)

        zero = jax.tree.map(jnp.zeros_like, trainable)
        grads, (losses, auxs) = jax.lax.scan(one, zero, (micro, weights))
        aux = combine_micro_batch_aux(auxs, micro.completion_mask, weights)
        return (jnp.sum(weights * losses), aux), grads

    def _update_step(
        self, policy: FrozenPolicy, trainable: Any, opt_state: Any, batch: RolloutBatch
    ) -> tuple[Any, Any, dict[str, jax.Array]]:
        """One optax update on one mini-batch: (trainable, opt_state, metrics).

        Pure and jitted as `update_step`; lowerable with `jax.ShapeDtypeStruct` leaves for every
        argument (a memory planner: `update_step.lower(...).compile().memory_analysis()`).
        """
        (loss, aux), grads = self.loss_and_grad(policy, trainable, batch)
        return self._apply(trainable, opt_state, loss, aux, grads)

    def _apply(
        self, trainable: Any, opt_state: Any, loss: jax.Array, aux: dict, grads: Any
    ) -> tuple[Any, Any, dict[str, jax.Array]]:
        """The optax update from a mini-batch's gradients, and the step's metrics (both update
        steps, one device or data-parallel)."""
        updates, opt_state = self.optimizer.update(grads, opt_state, trainable)
        trainable = optax.apply_updates(trainable, updates)
        metrics = {
            **aux,
            "loss": loss,
            "grad_norm": optax.tree.norm(grads),
            "update_norm": optax.tree.norm(updates),
        }
        return trainable, opt_state, metrics

    # -- data-parallel pieces (a mesh was given)

    def _shard(self, body: Callable, in_specs: tuple, out_specs: Any) -> Callable:
        """`body` once per block of rows: `jax.shard_map` over ``data`` alone, so ``model`` stays
        Auto (base weights split over it stay split, as in `population.engine`)."""
        return jax.shard_map(
            body,
            mesh=self.mesh,
            in_specs=in_specs,
            out_specs=out_specs,
            axis_names=frozenset({DATA_AXIS}),
            # generate writes per-shard values into a jnp.zeros KV cache inside while_loop, which
            # vma checking rejects (as in population.engine); the bodies' collectives are explicit.
            check_vma=False,
        )

    def _rollout_sharded(
        self,
        policy: FrozenPolicy,
        trainable: Any,
        prompt_tokens: jax.Array,
        prompt_mask: jax.Array,
        key: jax.Array,
    ) -> Generation:
        """`_rollout` over the mesh: rows [R_pad] sharded over ``data`` (R = P * group_size, groups
        contiguous, padded to the axis with copies of row 0: `mesh.pad_to`).

        Row r samples with fold_in(key, r) (`row_keys`) whatever the device or process that
        generates it; each device runs its rows in chunks of cfg.rows_per_chunk (0 = at once).
        Nothing crosses devices: the decode loop of each device stops when its own rows are done.
        """
        cfg = self.cfg
        tokens = jnp.repeat(prompt_tokens, cfg.group_size, axis=0)
        mask = jnp.repeat(prompt_mask, cfg.group_size, axis=0)
        padded = padded_size(tokens.shape[0], self.data)
        keys = row_keys(key, tokens.shape[0])
        tokens, mask, keys = (pad_to(x, padded, 0) for x in (tokens, mask, keys))

        def body(policy, trainable, tokens, mask, keys):
            return generate_chunked(
                policy.base,
                self.model_config,
                tokens,
                mask,
                keys,
                rows_per_chunk=cfg.rows_per_chunk,
                max_new_tokens=cfg.max_new_tokens,
                temperature=cfg.temperature,
                top_k=cfg.top_k,
                top_p=cfg.top_p,
                lora=self.to_lora(trainable, policy.adapter),
                eos_token_ids=self.eos_token_ids,
            )

        rows = P(DATA_AXIS)
        return self._shard(body, (P(), P(), rows, rows, rows), rows)(
            policy, trainable, tokens, mask, keys
        )

    def _score_sharded(
        self,
        policy: FrozenPolicy,
        trainable: Any,
        tokens: jax.Array,
        attention_mask: jax.Array,
        with_policy: bool = True,
        with_ref: bool = False,
        last: int | None = None,
    ) -> tuple[jax.Array | None, jax.Array | None]:
        """`_score` of data-sharded rows [B_pad, T], each device scoring its own block."""

        def body(policy, trainable, tokens, attention_mask):
            return self._score(
                policy, trainable, tokens, attention_mask, with_policy, with_ref, last
            )

        rows = P(DATA_AXIS)
        return self._shard(body, (P(), P(), rows, rows), (rows, rows))(
            policy, trainable, tokens, attention_mask
        )

    def _update_step_sharded(
        self,
        policy: FrozenPolicy,
        trainable: Any,
        opt_state: Any,
        batch: RolloutBatch,
        num_rows: int | None = None,
    ) -> tuple[Any, Any, dict[str, jax.Array]]:
        """`_update_step` on a mini-batch of B_pad rows sharded over ``data``; rows >= num_rows
        (static; None = none) are padding with completion_mask and advantages 0.

        Each device accumulates over its own micro-batches of cfg.micro_batch_size rows (0 = all
        its rows), and one psum adds the weighted gradients. The d x n micro-batches of all
        devices are the micro-batches of `loss_and_grad`, weighed by `micro_batch_weights` of the
        all-gathered completion mask, so the token mean divides by the *global* token count
        (max(N_i, 1) / max(N, 1)); the sequence means' 1 / (d n) is rescaled to rows / num_rows
        so padding rows count in no denominator. The update equals the one-device one up to
        summation order; aux is `combine_micro_batch_aux` over all micro-batches (advantage
        statistics over the real rows), identical on every device.
        """
        cfg = self.cfg
        padded, d = batch.tokens.shape[0], self.data
        num_rows = padded if num_rows is None else num_rows
        if padded % d or padded != padded_size(num_rows, d):
            raise ValueError(
                f"a data-parallel mini-batch of {num_rows} rows must arrive padded to "
                f"{padded_size(num_rows, d)} (a multiple of data={d}), got {padded}"
            )
        cfg.check_micro_batch(num_rows, d)
        local = padded // d
        mbs = cfg.micro_batch_size or local
        n = local // mbs
        grad_fn = jax.value_and_grad(self.loss, argnums=1, has_aux=True)

        def body(policy, trainable, batch):
            micro = jax.tree.map(lambda x: x.reshape(n, mbs, *x.shape[1:]), batch)
            masks = jax.lax.all_gather(micro.completion_mask, DATA_AXIS, tiled=True)  # [d n, ...]
            weights = micro_batch_weights(masks, cfg.agg)  # [d n]
            if cfg.agg != "token_mean":
                weights = weights * (padded / num_rows)
            start = jax.lax.axis_index(DATA_AXIS) * n
            mine = jax.lax.dynamic_slice_in_dim(weights, start, n)

            def one(acc, xs):
                mb, w = xs
                (loss, aux), g = grad_fn(policy, trainable, mb)
                acc = jax.tree.map(lambda a, gi: a + w.astype(gi.dtype) * gi, acc, g)
                return acc, (loss, aux)

            zero = jax.tree.map(jnp.zeros_like, trainable)
            grads, (losses, auxs) = jax.lax.scan(one, zero, (micro, mine))
            grads = jax.lax.psum(grads, DATA_AXIS)  # the one all-reduce of the update
            losses, auxs = jax.lax.all_gather((losses, auxs), DATA_AXIS, tiled=True)
            aux = combine_micro_batch_aux(auxs, masks, weights)
            if num_rows < padded:
                adv = jax.lax.all_gather(batch.advantages, DATA_AXIS, tiled=True)[:num_rows]
                aux.update(
                    adv_mean=jnp.mean(adv),
                    adv_std=jnp.std(adv),
                    adv_min=jnp.min(adv),
                    adv_max=jnp.max(adv),
                )
            return jnp.sum(weights * losses), aux, grads

        loss, aux, grads = self._shard(body, (P(), P(), P(DATA_AXIS)), (P(), P(), P()))(
            policy, trainable, batch
        )
        return self._apply(trainable, opt_state, loss, aux, grads)

    def _assemble_batch(
        self,
        prompt_tokens: jax.Array,
        prompt_mask: jax.Array,
        gen: Generation,
        advantages: jax.Array,
    ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
        """(tokens, attention mask, completion mask, advantages) of a sharded rollout [R_pad]:
        prompts repeated and padded as `_rollout_sharded` did; padding rows get completion mask
        and advantage 0 (they then weigh nothing in any aggregation)."""
        n = self.cfg.group_size
        padded, num_rows = gen.tokens.shape[0], prompt_tokens.shape[0] * n
        real = jnp.arange(padded) < num_rows
        prompt = pad_to(jnp.repeat(prompt_tokens, n, 0), padded, 0)
        pmask = pad_to(jnp.repeat(prompt_mask, n, 0), padded, 0)
        tokens = jnp.concatenate([prompt, gen.tokens], axis=1)
        attn = jnp.concatenate([pmask.astype(jnp.int32), gen.mask.astype(jnp.int32)], axis=1)
        comp = gen.mask.astype(jnp.float32) * real[:, None]
        adv = pad_to(advantages, padded, 0) * real
        return tokens, attn, comp, adv

    def _take_rows(self, batch: RolloutBatch, idx: jax.Array, valid: jax.Array) -> RolloutBatch:
        """Rows `idx` [b] of a sharded batch (a mini-batch), those with valid 0 made padding."""
        sub = jax.tree.map(lambda x: x[idx], batch)
        return sub.replace(
            completion_mask=sub.completion_mask * valid[:, None],
            advantages=sub.advantages * valid,
        )

    # -- the host step

    def make_batch(
        self,
        policy: FrozenPolicy,
        trainable: Any,
        prompt_tokens: jax.Array,
        prompt_mask: jax.Array,
        gen: Generation,
        rewards: jax.Array,
    ) -> tuple[RolloutBatch, dict[str, jax.Array]]:
        """Assemble the optimisation batch (advantages, old / reference log-probs) of a rollout."""
        cfg = self.cfg
        n = cfg.group_size
        tokens = jnp.concatenate([jnp.repeat(prompt_tokens, n, 0), gen.tokens], axis=1)
        attn = jnp.concatenate(
            [jnp.repeat(prompt_mask, n, 0).astype(jnp.int32), gen.mask.astype(jnp.int32)], axis=1
        )
        comp_mask = gen.mask.astype(jnp.float32)
        advantages, weights = compute_advantages(rewards, cfg)
        batch = self._batch(policy, trainable, gen, tokens, attn, comp_mask, advantages)
        return batch, {"focal_weight_mean": jnp.mean(weights)}

    def _batch(
        self,
        policy: FrozenPolicy,
        trainable: Any,
        gen: Generation,
        tokens: jax.Array,
        attn: jax.Array,
        comp_mask: jax.Array,
        advantages: jax.Array,
    ) -> RolloutBatch:
        """The optimisation batch of assembled rollout rows (one device or data-sharded): old
        log-probs scored when several updates follow one rollout (or the generation's, with
        use_generation_logprobs), reference log-probs when there is a KL term."""
        cfg = self.cfg
        multi_update = cfg.epochs * cfg.num_minibatches > 1
        need_old = multi_update and not cfg.use_generation_logprobs
        need_ref = cfg.beta > 0
        old = ref = None
        if need_old or need_ref:
            old, ref = self.score(
                policy,
                trainable,
                tokens,
                attn,
                with_policy=need_old,
                with_ref=need_ref,
                last=gen.tokens.shape[1],
            )
        if cfg.use_generation_logprobs:
            old = gen.logprobs
        return RolloutBatch(
            tokens=tokens,
            attention_mask=attn,
            completion_mask=comp_mask,
            advantages=advantages,
            old_logp=old,
            ref_logp=ref,
        )

    def step(
        self,
        state: GRPOState,
        policy: FrozenPolicy,
        prompt_tokens: jax.Array,
        prompt_mask: jax.Array,
        prompts: Sequence[Any],
        **task_fields: Sequence[Any],
    ) -> tuple[GRPOState, dict[str, float]]:
        """One GRPO-family step on P prompts: P * group_size rollouts, then the updates.

        Args:
          state: `GRPOState`.
          policy: `FrozenPolicy(base params, frozen adapter)`.
          prompt_tokens, prompt_mask: [P, Tp] left-padded prompts (keep Tp fixed across steps
            to avoid recompiling).
          prompts: the P prompts as the reward function expects them (text or chat messages).
          task_fields: per-prompt fields passed to the reward function (e.g. answer=[...]).

        Returns:
          (new state, metrics): floats, see the module docstring of `essa_jax.rl`.
        """
        cfg = self.cfg
        num_prompts = prompt_tokens.shape[0]
        if len(prompts) != num_prompts:
            raise ValueError(f"{len(prompts)} prompts for {num_prompts} rows of prompt_tokens")
        for name, vals in task_fields.items():
            if len(vals) != num_prompts:
                raise ValueError(f"task field {name!r} has {len(vals)} values for {num_prompts}")
        num_rollouts = num_prompts * cfg.group_size
        if self.mesh is not None:
            return self._step_sharded(
                state, policy, prompt_tokens, prompt_mask, prompts, task_fields
            )
        cfg.check_batch(num_rollouts)

        key = jax.random.wrap_key_data(state.key)
        key, k_roll, k_shuffle = jax.random.split(key, 3)

        t0 = time.perf_counter()
        gen = jax.block_until_ready(
            self.rollout(policy, state.params, prompt_tokens, prompt_mask, k_roll)
        )
        t_roll = time.perf_counter() - t0

        t0 = time.perf_counter()
        lengths = np.asarray(gen.lengths)
        finished = np.asarray(gen.finished)
        completions = decode_completions(self.decode, gen.tokens, lengths, self.eos_token_ids)
        rep = lambda xs: [x for x in xs for _ in range(cfg.group_size)]  # noqa: E731
        rewards = self.reward_fn(
            rep(prompts), completions, **{k: rep(v) for k, v in task_fields.items()}
        )
        if len(rewards) != num_rollouts:
            raise ValueError(f"reward_fn returned {len(rewards)} rewards for {num_rollouts}")
        rewards = jnp.asarray(np.asarray(rewards, np.float32))
        t_reward = time.perf_counter() - t0

        t0 = time.perf_counter()
        batch, extra = self.make_batch(
            policy, state.params, prompt_tokens, prompt_mask, gen, rewards
        )
        jax.block_until_ready(batch)
        t_score = time.perf_counter() - t0

        t0 = time.perf_counter()
        params, opt_state = state.params, state.opt_state
        mb = num_rollouts // cfg.num_minibatches
        per_update = []
        for epoch in range(cfg.epochs):
            if cfg.num_minibatches > 1:
                perm = jax.random.permutation(jax.random.fold_in(k_shuffle, epoch), num_rollouts)
            else:
                perm = None
            for j in range(cfg.num_minibatches):
                if perm is None:
                    sub = batch
                else:
                    idx = perm[j * mb : (j + 1) * mb]
                    sub = jax.tree.map(lambda x, idx=idx: x[idx], batch)
                params, opt_state, m = self.update_step(policy, params, opt_state, sub)
                per_update.append(m)
        per_update = jax.device_get(per_update)
        t_update = time.perf_counter() - t0

        new_state = GRPOState(
            params=params,
            opt_state=opt_state,
            step=state.step + 1,
            key=jax.random.key_data(key),
        )
        times = (t_roll, t_reward, t_score, t_update)
        metrics = self._metrics(rewards, lengths, finished, extra, times, per_update)
        metrics["local_rollouts"] = float(num_rollouts)
        return new_state, metrics

    def _metrics(
        self,
        rewards: Any,
        lengths: np.ndarray,
        finished: np.ndarray,
        extra: dict[str, jax.Array],
        times: tuple[float, float, float, float],
        per_update: list[dict[str, Any]],
    ) -> dict[str, float]:
        """The step's metrics from all rollouts' rewards / lengths / finished flags [R].

        The paper's training diagnostics (F-GRPO, arXiv 2602.06717): all_right_frac /
        all_wrong_frac (`group_outcome_fractions`, right = reward >= cfg.r_correct) split
        zero_variance_frac; `entropy` (from `policy_loss`'s aux) is the mean token entropy, in
        nats, of the sampling distribution (logits / temperature; top-k / top-p not applied) over
        every completion token of the batch (EOS included, padding excluded; pooled, so a longer
        completion weighs more), computed in the update's forward pass: with one update per step
        (epochs = num_minibatches = 1, the default) that is exactly the policy that sampled the
        rollouts, before its update; with several it is the mean over the updates.
        """
        t_roll, t_reward, t_score, t_update = times
        r = np.asarray(rewards)
        num_tokens = float(lengths.sum())
        all_right, all_wrong = group_outcome_fractions(
            rewards, self.cfg.group_size, self.cfg.r_correct, self.cfg.r_wrong
        )
        metrics = {
            "reward_mean": float(r.mean()),
            "reward_std": float(r.std()),
            "zero_variance_frac": float(zero_variance_fraction(rewards, self.cfg.group_size)),
            "all_right_frac": float(all_right),
            "all_wrong_frac": float(all_wrong),
            "focal_weight_mean": float(extra["focal_weight_mean"]),
            "completion_len_mean": float(lengths.mean()),
            "truncation_rate": float(1.0 - finished.mean()),
            "rollout_s": t_roll,
            "reward_s": t_reward,
            "score_s": t_score,
            "update_s": t_update,
            "step_s": t_roll + t_reward + t_score + t_update,
        }
        metrics["tokens_per_s"] = num_tokens / metrics["step_s"]
        metrics["rollout_tokens_per_s"] = num_tokens / max(t_roll, 1e-9)
        # Update diagnostics: mean over the step's updates, except the ratio extremes.
        reduce = {"ratio_min": np.min, "ratio_max": np.max}
        for k in per_update[0]:
            vals = np.asarray([float(m[k]) for m in per_update])
            metrics[k] = float(reduce.get(k, np.mean)(vals))
        return metrics

    def _step_sharded(
        self,
        state: GRPOState,
        policy: FrozenPolicy,
        prompt_tokens: Any,
        prompt_mask: Any,
        prompts: Sequence[Any],
        task_fields: Mapping[str, Sequence[Any]],
    ) -> tuple[GRPOState, dict[str, float]]:
        """`step` over the mesh (docs/ARCHITECTURE.md, "Data-parallel GRPO and SFT").

        Every process calls it with the same state and prompts. One sharded rollout program over
        every process's devices; each process decodes and rewards only the rows its devices
        generated (`local_rows`: metrics["local_rollouts"] counts them); per-row rewards, lengths
        and finished flags are all-gathered (`allgather_rows`), so the advantages, the batch and
        the data-parallel updates are the same everywhere.
        """
        cfg, mesh = self.cfg, self.mesh
        n = cfg.group_size
        num_rollouts = int(np.shape(prompt_tokens)[0]) * n
        cfg.check_batch(num_rollouts, self.data)
        key = jax.random.wrap_key_data(state.key)
        key, k_roll, k_shuffle = jax.random.split(key, 3)
        # Host values every process holds identically -> global arrays (nothing travels); the
        # base weights should come placed already (`place_base`), then this keeps them.
        policy, params, opt_state = on_mesh((policy, state.params, state.opt_state), mesh)
        tokens, mask, k_roll = on_mesh(
            (
                np.asarray(prompt_tokens, np.int32),
                np.asarray(prompt_mask, np.int32),
                np.asarray(jax.random.key_data(k_roll)),
            ),
            mesh,
        )

        t0 = time.perf_counter()
        gen = jax.block_until_ready(self.rollout(policy, params, tokens, mask, k_roll))
        t_roll = time.perf_counter() - t0

        t0 = time.perf_counter()
        rows, mine = local_rows(gen, num_rollouts)
        groups = (rows // n).tolist()
        local_rewards: Sequence[float] = []
        if groups:
            completions = decode_completions(
                self.decode, mine.tokens, mine.lengths, self.eos_token_ids
            )
            local_rewards = self.reward_fn(
                [prompts[g] for g in groups],
                completions,
                **{k: [v[g] for g in groups] for k, v in task_fields.items()},
            )
        if len(local_rewards) != len(rows):
            raise ValueError(f"reward_fn returned {len(local_rewards)} rewards for {len(rows)}")
        per_row = np.stack(
            [np.asarray(local_rewards, np.float32).reshape(-1), mine.lengths, mine.finished]
        ).astype(np.float32)
        rewards, lengths, finished = allgather_rows(per_row, rows, num_rollouts)
        lengths, finished = lengths.astype(np.int32), finished > 0
        rewards = jnp.asarray(rewards)
        t_reward = time.perf_counter() - t0

        t0 = time.perf_counter()
        advantages, weights = compute_advantages(rewards, cfg)
        tokens, attn, comp_mask, advantages = self._assemble(
            tokens, mask, gen, on_mesh(np.asarray(advantages), mesh)
        )
        batch = self._batch(policy, params, gen, tokens, attn, comp_mask, advantages)
        jax.block_until_ready(batch)
        t_score = time.perf_counter() - t0

        t0 = time.perf_counter()
        mb = num_rollouts // cfg.num_minibatches
        padded = padded_size(mb, self.data)
        valid = on_mesh((np.arange(padded) < mb).astype(np.float32), mesh)
        per_update = []
        for epoch in range(cfg.epochs):
            perm = None
            if cfg.num_minibatches > 1:
                # The permutation of the one-device step, the same on every process.
                perm = np.asarray(
                    jax.random.permutation(jax.random.fold_in(k_shuffle, epoch), num_rollouts)
                )
            for j in range(cfg.num_minibatches):
                if perm is None:
                    sub = batch  # rows >= num_rollouts are padding already
                else:
                    idx = perm[j * mb : (j + 1) * mb]
                    idx = np.concatenate([idx, np.full(padded - mb, idx[0])]).astype(np.int32)
                    sub = self._take(batch, on_mesh(idx, mesh), valid)
                params, opt_state, m = self.update_step(policy, params, opt_state, sub, num_rows=mb)
                per_update.append(m)
        per_update = jax.device_get(per_update)
        t_update = time.perf_counter() - t0

        new_state = GRPOState(
            params=params,
            opt_state=opt_state,
            step=state.step + 1,
            key=jax.random.key_data(key),
        )
        extra = {"focal_weight_mean": jnp.mean(weights)}
        times = (t_roll, t_reward, t_score, t_update)
        metrics = self._metrics(rewards, lengths, finished, extra, times, per_update)
        metrics["local_rollouts"] = float(len(rows))
        return new_state, metrics
