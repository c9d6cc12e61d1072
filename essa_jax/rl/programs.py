"""The compiled programs of a GRPO-family step, each one `jax.shard_map` over the ``data`` axis of
a mesh (one device = a mesh of one): rollout, scoring, the policy loss and the update.

(docs/ARCHITECTURE.md, "The path of a rollout" and "Data-parallel GRPO and SFT".) Rows are sharded
over ``data`` and padded to it with copies of row 0 (`essa_jax.mesh.pad_to`); the trainable, the
optimiser state and the base weights stay replicated over it (the weights split over an Auto
``model`` axis, `rl.placement.place_base`), except in full-parameter training (`lora.full`),
which splits them over ``data`` too (ZeRO-3 / FSDP: `shard_weights`,
`rl.placement.zero_placement`; scoring and the loss gather each layer's weights inside the layer
scan, `mesh.gather_outside_layers`). Each device generates, scores and differentiates its own
block of rows; one psum per update adds the gradients (FSDP: the per-layer gathers' transposes
reduce-scatter them, per layer and micro-batch). On a data axis of one device there is
no padding and no collective (`essa_jax.mesh.over_data` is the body itself, `data_psum` /
`data_all_gather` the identity), so a one-device program is the plain one, bit for bit.

All programs are pure and lower from `jax.ShapeDtypeStruct` arguments (the memory plan).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from essa_jax.lora.adapter import ToLora
from essa_jax.lora.full import ToParams, compute_copy, model_weights
from essa_jax.mesh import (
    DATA_AXIS,
    MODEL_AXIS,
    axis_size,
    data_all_gather,
    data_only,
    data_psum,
    data_psum_unsplit,
    gather_outside_layers,
    on_mesh,
    over_data,
    pad_to,
    padded_size,
    param_specs,
)
from essa_jax.models.config import ModelConfig
from essa_jax.models.generate import Generation, generate, generate_chunked, row_keys
from essa_jax.models.logprobs import sequence_logprobs
from essa_jax.rl.config import GRPOConfig
from essa_jax.rl.losses import combine_micro_batch_aux, micro_batch_weights, policy_loss
from essa_jax.rl.placement import zero_placement, zero_specs
from essa_jax.rl.state import FrozenPolicy, RolloutBatch

ROWS = P(DATA_AXIS)


class GRPOPrograms:
    """The jitted programs of one model config, `GRPOConfig`, parameterisation and mesh.

    Public, each jitted once (no buffer donation: a caller may keep the old state, e.g. to retry
    or compare a step):
      rollout(policy, trainable, prompt_tokens [P, Tp], prompt_mask [P, Tp], key) -> Generation
        of the R = P * group_size rows padded to the data axis;
      score(policy, trainable, tokens, attention_mask, with_policy=, with_ref=, last=) ->
        (policy, reference) log-probs of sharded rows;
      update_step(policy, trainable, opt_state, batch, num_rows=None) -> (trainable, opt_state,
        metrics): one optax update on a sharded mini-batch whose rows >= num_rows are padding.
    """

    def __init__(
        self,
        model_config: ModelConfig,
        cfg: GRPOConfig,
        to_lora: ToLora,
        optimizer: optax.GradientTransformation,
        eos_token_ids: Sequence[int],
        mesh: Mesh,
        to_params: ToParams | None = None,
    ):
        self.model_config = model_config
        self.cfg = cfg
        self.to_lora = to_lora
        self.to_params = to_params
        self.optimizer = optimizer
        self.eos_token_ids = tuple(eos_token_ids)
        self.mesh = mesh
        self.data = axis_size(mesh, DATA_AXIS)
        # Full-parameter training on a data axis > 1: masters, AdamW state and gradients sharded
        # over it (ZeRO / FSDP, `state_shardings`); adapters stay replicated (they are small).
        self.shard_weights = to_params is not None and self.data > 1
        rows = NamedSharding(mesh, ROWS)
        self.rollout = jax.jit(self._rollout)
        self.score = jax.jit(self._score, static_argnames=("with_policy", "with_ref", "last"))
        self.update_step = jax.jit(self._update_step, static_argnames=("num_rows",))
        self.assemble = jax.jit(self._assemble, out_shardings=rows)
        self.take = jax.jit(self._take, out_shardings=rows)

    def trainable_specs(self, trainable: Any) -> Any:
        """`PartitionSpec`s of the trainable: `rl.placement.zero_specs` (over ``model`` and
        ``data``) when `shard_weights`, else replicated."""
        if not self.shard_weights:
            return jax.tree.map(lambda _: P(), trainable)
        return zero_specs(trainable, self.mesh, self.model_config)

    def state_shardings(self, trainable: Any, opt_state: Any) -> tuple[Any, Any]:
        """`NamedSharding`s of (trainable, optimiser state) with `shard_weights`: every device
        holds 1/data of the float32 masters and of AdamW's m and v (`rl.placement.zero_placement`:
        ZeRO's partition of the optimiser state, parameters and gradients)."""
        return zero_placement(trainable, opt_state, self.optimizer, self.mesh, self.model_config)

    def place_state(self, trainable: Any, opt_state: Any) -> tuple[Any, Any]:
        """(trainable, optimiser state) as global arrays with `state_shardings` (kept when they
        have them already: only a fresh or restored state moves)."""
        trainable, opt_state = on_mesh((trainable, opt_state), self.mesh)
        if not self.shard_weights:
            return trainable, opt_state
        t_sh, o_sh = self.state_shardings(trainable, opt_state)
        return jax.device_put(trainable, t_sh), jax.device_put(opt_state, o_sh)

    def compute_weights(self, policy: FrozenPolicy, trainable: Any) -> Any:
        """What a program's shard_map receives of the trainable: with `shard_weights` the masters
        cast to the base's dtype outside it (`lora.full.compute_copy`, elementwise on the shards:
        every gather then moves bfloat16 weights, half the bytes of the float32 masters); else
        the trainable as it is."""
        return compute_copy(trainable, policy.base) if self.shard_weights else trainable

    def base_specs(self, policy: FrozenPolicy) -> Any:
        """`PartitionSpec`s of the base weights (and so of the weights the model runs with:
        `merge_weights` keeps the base's tree) split over ``model`` and ``data``
        (`mesh.param_specs`), at their global shapes; for `shard_weights`."""
        model = axis_size(self.mesh, MODEL_AXIS)
        return param_specs(policy.base, self.model_config, model, self.data)

    def sharded_in_specs(self, policy: FrozenPolicy, trainable: Any) -> tuple[Any, Any]:
        """`over_data` in_specs of (policy, compute weights) in the scoring and update programs:
        with `shard_weights` both enter split over ``data`` (`data_only` of their specs: the
        base, the KL reference, stays sharded too), else replicated."""
        if not self.shard_weights:
            return P(), P()
        base = jax.tree.map(data_only, self.base_specs(policy))
        trained = jax.tree.map(data_only, self.trainable_specs(trainable))
        return policy.replace(base=base, adapter=P()), trained

    def gathered(self, weights: Any, specs: Any = None) -> tuple[Any, Any]:
        """(weights, layer gather) the model runs with inside a program body: `weights` as they
        are (no gather), or with `specs` (`base_specs`: they arrived split over ``data``)
        gathered FSDP-style, the non-layer leaves once here and each layer inside the layer scan
        (`mesh.gather_outside_layers`)."""
        if specs is None:
            return weights, None
        return gather_outside_layers(weights, specs, self.mesh)

    def weights(self, policy: FrozenPolicy, trainable: Any) -> Any:
        """The weights the policy runs with: the base, or with full-parameter training
        (`to_params`, `lora.full.merge_weights`) the trained weights cast to the base's dtype."""
        return model_weights(trainable, policy.base, self.to_params)

    # -- rollout

    def _rollout(
        self,
        policy: FrozenPolicy,
        trainable: Any,
        prompt_tokens: jax.Array,
        prompt_mask: jax.Array,
        key: jax.Array,
    ) -> Generation:
        """group_size completions per prompt: rows [R_pad] sharded over ``data`` (R = P *
        group_size, each prompt's group contiguous, padded to the axis with copies of row 0).

        Row r samples with fold_in(key, r) (`models.generate.row_keys`) whatever the device or
        process that generates it; each device runs its rows in chunks of cfg.rows_per_chunk (0 =
        at once), one chunk's KV cache live at a time; its decode loop stops when its own rows are
        done (no collective per token). One exception keeps the single-device sampling of
        `models.generate`: on a data axis of one device with rows_per_chunk = 0 the batch samples
        with the one key (other draws than the per-row keys). `key`: typed or raw key data.

        With `shard_weights` the weights enter replicated over ``data``: the one re-shard per
        step into the generation layout (decoding then reads only local weights), an all-gather
        of the bf16 compute copy (and of the base's frozen leaves) of (data - 1) / data x 2 bytes
        x weights / model received per device (Qwen2.5-7B on data = 8: 13.3 GB), the whole bf16
        model then held for the rollout.
        """
        cfg = self.cfg
        if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
            key = jax.random.key_data(key)
        tokens = jnp.repeat(prompt_tokens, cfg.group_size, axis=0)
        mask = jnp.repeat(prompt_mask, cfg.group_size, axis=0)
        padded = padded_size(tokens.shape[0], self.data)
        one_key = self.data == 1 and not cfg.rows_per_chunk
        keys = key if one_key else jax.random.key_data(row_keys(key, tokens.shape[0]))
        tokens, mask = pad_to(tokens, padded, 0), pad_to(mask, padded, 0)
        if not one_key:
            keys = pad_to(keys, padded, 0)
        settings = dict(
            max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            top_k=cfg.top_k,
            top_p=cfg.top_p,
            eos_token_ids=self.eos_token_ids,
        )

        def body(policy, trainable, tokens, mask, keys):
            lora, params = self.to_lora(trainable, policy.adapter), self.weights(policy, trainable)
            if one_key:
                return generate(
                    params, self.model_config, tokens, mask, keys, lora=lora, **settings
                )
            return generate_chunked(
                params,
                self.model_config,
                tokens,
                mask,
                keys,
                rows_per_chunk=cfg.rows_per_chunk,
                lora=lora,
                **settings,
            )

        key_spec = P() if one_key else ROWS
        return over_data(body, self.mesh, (P(), P(), ROWS, ROWS, key_spec), ROWS)(
            policy, self.compute_weights(policy, trainable), tokens, mask, keys
        )

    # -- scoring

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
        """(policy, reference) log-probs [B_pad, T-1] of data-sharded rows `tokens` ([B_pad, last]
        of their final `last` targets: the completion), each device scoring its own block; the
        reference is the base model with the adapter disabled (lora=None), so no second copy of
        the weights exists."""

        specs = self.base_specs(policy) if self.shard_weights else None

        def body(policy, trainable, tokens, attention_mask):
            out = []
            # the policy's weights, and the initial weights with no adapter (the reference);
            # with `shard_weights` both split over data and gathered a layer at a time
            for on, weights, lora in (
                (
                    with_policy,
                    self.weights(policy, trainable),
                    self.to_lora(trainable, policy.adapter),
                ),
                (with_ref, policy.base, None),
            ):
                params, gather = self.gathered(weights, specs)
                out.append(
                    sequence_logprobs(
                        params,
                        self.model_config,
                        tokens,
                        attention_mask,
                        lora=lora,
                        temperature=self.cfg.temperature,
                        remat=self.cfg.remat,
                        last=last,
                        gather=gather,
                    )
                    if on
                    else None
                )
            return out[0], out[1]

        in_specs = (*self.sharded_in_specs(policy, trainable), ROWS, ROWS)
        return over_data(body, self.mesh, in_specs, (ROWS, ROWS))(
            policy, self.compute_weights(policy, trainable), tokens, attention_mask
        )

    # -- the loss and the update

    def loss(
        self, policy: FrozenPolicy, trainable: Any, batch: RolloutBatch, specs: Any = None
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The policy loss of `batch` (local rows) under `trainable` (to be minimised) and its
        diagnostics (`rl.losses.policy_loss`: GRPO / DAPO clipped ratio, CISPO clipped weight).
        `specs` (`base_specs`, inside `over_data`): the weights arrive split over ``data`` and
        are gathered a layer at a time (`gathered`)."""
        cfg = self.cfg
        num_new = batch.completion_mask.shape[1]
        params, gather = self.gathered(self.weights(policy, trainable), specs)
        lp, ent = sequence_logprobs(
            params,
            self.model_config,
            batch.tokens,
            batch.attention_mask,
            lora=self.to_lora(trainable, policy.adapter),
            temperature=cfg.temperature,
            return_entropy=True,
            remat=cfg.remat,
            last=num_new,  # the head and its softmax run on the completion positions only
            gather=gather,
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

    def _accumulate(
        self,
        policy: FrozenPolicy,
        trainable: Any,
        batch: RolloutBatch,
        weights: jax.Array,
        specs: tuple[Any, Any] | None = None,
    ) -> tuple[tuple[jax.Array, dict[str, jax.Array]], Any]:
        """((losses [n], auxs [n]), sum_i w_i grad_i) of one device's rows [b, ...] split into
        n contiguous micro-batches under `lax.scan` (one micro-batch's activations alive at a
        time), `weights` [n] those of `micro_batch_weights`.

        `specs` = (`base_specs`, `trainable_specs`) (inside `over_data`, `shard_weights`: the
        trainable and the base arrive split over ``data``): the loss gathers each layer's weights
        inside the layer scan (`gathered`), so each micro-batch's backward pass
        reduce-scatters every split leaf's gradient over ``data`` as it is made (the gather's
        transpose, `mesh.data_gather`: FSDP's reduce-scatter per layer and micro-batch) and the
        float32 accumulator is this device's 1/data shard of every leaf, summed over devices; the
        leaves left whole get one psum at the end (`mesh.data_psum_unsplit`). None: the local
        sum. The weight w_i scales the loss before differentiation, since the sum over devices
        happens inside the backward pass.
        """
        model_specs, trained_specs = (None, None) if specs is None else specs
        n = weights.shape[0]
        micro = jax.tree.map(lambda x: x.reshape(n, -1, *x.shape[1:]), batch)

        def weighted(t: Any, mb: RolloutBatch, w: jax.Array) -> tuple[jax.Array, Any]:
            loss, aux = self.loss(policy, t, mb, model_specs)
            return w * loss, (loss, aux)

        grad_fn = jax.grad(weighted, has_aux=True)

        def one(acc, xs):
            mb, w = xs
            g, (loss, aux) = grad_fn(trainable, mb, w)
            return jax.tree.map(lambda a, gi: a + gi.astype(jnp.float32), acc, g), (loss, aux)

        # float32 accumulators whatever the trainable's dtype (a sharded update differentiates the
        # bfloat16 compute copy's shards, `compute_weights`).
        zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), trainable)
        grads, (losses, auxs) = jax.lax.scan(one, zeros, (micro, weights))
        if specs is not None:
            grads = data_psum_unsplit(grads, trained_specs, self.mesh)
        return (losses, auxs), grads

    def loss_and_grad(
        self, policy: FrozenPolicy, trainable: Any, batch: RolloutBatch
    ) -> tuple[tuple[jax.Array, dict[str, jax.Array]], Any]:
        """((loss, aux), d loss / d trainable) of a mini-batch of B rollouts on one device.

        cfg.micro_batch_size = 0 (or B): one pass. Else gradient accumulation (`_accumulate`),
        micro-batch i weighed by `micro_batch_weights` so that every aggregation keeps the
        mini-batch's normaliser (token_mean: its token count; the sequence means: its row count).
        The update equals the whole-batch one up to summation order; aux is
        `combine_micro_batch_aux`'s.
        """
        B = batch.tokens.shape[0]
        mbs = self.cfg.micro_batch_size
        if not mbs or mbs == B:
            return jax.value_and_grad(self.loss, argnums=1, has_aux=True)(policy, trainable, batch)
        self.cfg.check_micro_batch(B)
        masks = batch.completion_mask.reshape(B // mbs, mbs, -1)
        weights = micro_batch_weights(masks, self.cfg.agg)
        (losses, auxs), grads = self._accumulate(policy, trainable, batch, weights)
        aux = combine_micro_batch_aux(auxs, masks, weights)
        return (jnp.sum(weights * losses), aux), grads

    def _update_step(
        self,
        policy: FrozenPolicy,
        trainable: Any,
        opt_state: Any,
        batch: RolloutBatch,
        num_rows: int | None = None,
    ) -> tuple[Any, Any, dict[str, jax.Array]]:
        """One optax update on a mini-batch of B_pad rows sharded over ``data``: (trainable,
        opt_state, metrics); rows >= num_rows (static; None = none) are padding with
        completion_mask and advantages 0.

        Each device accumulates over its own micro-batches of cfg.micro_batch_size rows (0 = all
        its rows), and one psum adds the weighted gradients. The d x n micro-batches of all
        devices are the micro-batches of `loss_and_grad`, weighed by `micro_batch_weights` of the
        all-gathered completion mask, so the token mean divides by the *global* token count
        (max(N_i, 1) / max(N, 1)); the sequence means' 1 / (d n) is rescaled to rows / num_rows
        so padding rows count in no denominator. The update equals the one-device one up to
        summation order; aux is `combine_micro_batch_aux` over all micro-batches (advantage
        statistics over the real rows), identical on every device. One device holding the whole
        mini-batch as one micro-batch takes one plain pass.
        """
        cfg, d = self.cfg, self.data
        padded = batch.tokens.shape[0]
        num_rows = padded if num_rows is None else num_rows
        if padded % d or padded != padded_size(num_rows, d):
            raise ValueError(
                f"a data-parallel mini-batch of {num_rows} rows must arrive padded to "
                f"{padded_size(num_rows, d)} (a multiple of data={d}), got {padded}"
            )
        cfg.check_micro_batch(num_rows, d)
        local = padded // d
        n = local // (cfg.micro_batch_size or local)
        specs = self.trainable_specs(trainable)
        model_specs = self.base_specs(policy) if self.shard_weights else None

        def body(policy, trainable, batch):
            if n * d == 1:
                (loss, aux), grads = jax.value_and_grad(self.loss, argnums=1, has_aux=True)(
                    policy, trainable, batch
                )
                return loss, aux, grads
            masks = data_all_gather(batch.completion_mask, self.mesh)
            masks = masks.reshape(d * n, local // n, -1)  # [d n, mbs, N]
            weights = micro_batch_weights(masks, cfg.agg)
            if cfg.agg != "token_mean" and num_rows < padded:
                weights = weights * (padded / num_rows)
            mine = weights
            if d > 1:
                mine = jax.lax.dynamic_slice_in_dim(weights, jax.lax.axis_index(DATA_AXIS) * n, n)
            if self.shard_weights:  # reduce-scattered per layer: each device its shard
                (losses, auxs), grads = self._accumulate(
                    policy, trainable, batch, mine, (model_specs, specs)
                )
            else:
                (losses, auxs), grads = self._accumulate(policy, trainable, batch, mine)
                grads = data_psum(grads, self.mesh)  # the one all-reduce of the update
            losses, auxs = data_all_gather((losses, auxs), self.mesh)
            aux = combine_micro_batch_aux(auxs, masks, weights)
            if num_rows < padded:
                adv = data_all_gather(batch.advantages, self.mesh)[:num_rows]
                aux.update(
                    adv_mean=jnp.mean(adv),
                    adv_std=jnp.std(adv),
                    adv_min=jnp.min(adv),
                    adv_max=jnp.max(adv),
                )
            return jnp.sum(weights * losses), aux, grads

        grad_specs = jax.tree.map(data_only, specs) if self.shard_weights else P()
        in_specs = (*self.sharded_in_specs(policy, trainable), ROWS)
        loss, aux, grads = over_data(body, self.mesh, in_specs, (P(), P(), grad_specs))(
            policy, self.compute_weights(policy, trainable), batch
        )
        updates, opt_state = self.optimizer.update(grads, opt_state, trainable)
        trainable = optax.apply_updates(trainable, updates)
        if self.shard_weights:  # the new state keeps the old one's shards
            t_sh, o_sh = self.state_shardings(trainable, opt_state)
            trainable = jax.lax.with_sharding_constraint(trainable, t_sh)
            opt_state = jax.lax.with_sharding_constraint(opt_state, o_sh)
        metrics = {
            **aux,
            "loss": loss,
            "grad_norm": optax.tree.norm(grads),
            "update_norm": optax.tree.norm(updates),
        }
        return trainable, opt_state, metrics

    # -- the batch on the mesh

    def _assemble(
        self,
        prompt_tokens: jax.Array,
        prompt_mask: jax.Array,
        gen: Generation,
        advantages: jax.Array,
    ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
        """(tokens, attention mask, completion mask, advantages) of a rollout [R_pad]: prompts
        repeated and padded as `_rollout` did; padding rows get completion mask and advantage 0
        (they then weigh nothing in any aggregation)."""
        n = self.cfg.group_size
        padded, num_rows = gen.tokens.shape[0], prompt_tokens.shape[0] * n
        real = jnp.arange(padded) < num_rows
        prompt = pad_to(jnp.repeat(prompt_tokens, n, 0), padded, 0)
        pmask = pad_to(jnp.repeat(prompt_mask, n, 0), padded, 0)
        tokens = jnp.concatenate([prompt, gen.tokens], axis=1)
        attn = jnp.concatenate([pmask.astype(jnp.int32), gen.mask.astype(jnp.int32)], axis=1)
        comp = gen.mask.astype(jnp.float32)
        adv = pad_to(advantages, padded, 0)
        if num_rows < padded:
            comp, adv = comp * real[:, None], adv * real
        return tokens, attn, comp, adv

    def _take(self, batch: RolloutBatch, idx: jax.Array, valid: jax.Array) -> RolloutBatch:
        """Rows `idx` [b] of a sharded batch (a mini-batch), those with valid 0 made padding."""
        sub = jax.tree.map(lambda x: x[idx], batch)
        return sub.replace(
            completion_mask=sub.completion_mask * valid[:, None],
            advantages=sub.advantages * valid,
        )
