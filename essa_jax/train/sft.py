"""LoRA supervised fine-tuning on a task's reference answers (ESSA step 1, arXiv 2507.04453 Sec. 3).

Loss: mean negative log-likelihood of the completion tokens (reference answer + EOS) given the
prompt; prompt tokens carry no loss. Optimiser: AdamW with global-norm clipping (optax). Only the
LoRA factors are trained; base weights are a non-differentiated argument.

Memory (docs/ARCHITECTURE.md, Memory): the LoRA and the AdamW state are float32 masters whatever
the model dtype (`lora.master_weights`); `remat` checkpoints each decoder layer; `micro_batch_size`
accumulates the gradient over micro-batches inside the compiled step (the same update).

Data parallelism (`mesh=`, docs/ARCHITECTURE.md, "Data-parallel GRPO and SFT"): the batch is
sharded over the mesh's ``data`` axis (padded to it with rows that carry no loss), the LoRA and
AdamW state replicated; each device computes its rows' gradient (accumulating over its own
micro-batches of `micro_batch_size` rows) and one psum adds them with the weights that keep the
global token count as the denominator.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from essa_jax.lora.adapter import master_weights
from essa_jax.lora.full import ToParams, compute_copy, model_weights
from essa_jax.mesh import (
    DATA_AXIS,
    axis_size,
    data_only,
    data_psum,
    data_psum_unsplit,
    gather_outside_layers,
    host_copy,
    over_data,
    padded_size,
    place,
    rows_per_device_problem,
)
from essa_jax.models import sequence_logprobs
from essa_jax.rl import on_mesh, place_base
from essa_jax.rl.optimizer import adamw as make_optimizer  # the one builder (rl.optimizer)
from essa_jax.rl.placement import zero_init, zero_placement, zero_specs
from essa_jax.train.rollouts import PromptSet, init_cursor, next_indices


def sft_sequences(data: PromptSet, pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """prompt + target per example, left-padded: (tokens, attention mask, loss mask) `[n, T]`.

    The loss mask is 1 on target positions, aligned with `tokens[:, 1:]` by the caller.
    """
    if not data.targets:
        raise ValueError("SFT needs reference completions (PromptSet.targets is empty)")
    seqs, is_target = [], []
    for row, m, tgt in zip(data.tokens, data.mask, data.targets, strict=True):
        prompt = [int(t) for t, k in zip(row, m, strict=True) if k]
        seqs.append(prompt + list(tgt))
        is_target.append([0] * len(prompt) + [1] * len(tgt))
    length = max(len(s) for s in seqs)
    tokens = np.full((len(seqs), length), pad_id, np.int32)
    mask = np.zeros((len(seqs), length), np.int32)
    loss_mask = np.zeros((len(seqs), length), np.int32)
    for i, (s, t) in enumerate(zip(seqs, is_target, strict=True)):
        tokens[i, length - len(s) :] = s
        mask[i, length - len(s) :] = 1
        loss_mask[i, length - len(s) :] = t
    return tokens, mask, loss_mask


def sft_loss(lora, params, model_config, tokens, mask, loss_mask, remat: bool = False, gather=None):
    """Mean NLL over target tokens: -sum(log p * m) / sum(m), m = loss_mask[:, 1:]. `gather`:
    FSDP's per-layer gather of split layer weights (`models.hidden_states`)."""
    lp = sequence_logprobs(
        params, model_config, tokens, mask, lora=lora, remat=remat, gather=gather
    )  # [B, T-1]
    m = loss_mask[:, 1:].astype(jnp.float32)
    return -jnp.sum(lp * m) / jnp.maximum(jnp.sum(m), 1.0)


def sft_loss_and_grad(
    lora,
    params,
    model_config,
    tokens: jax.Array,
    mask: jax.Array,
    loss_mask: jax.Array,
    *,
    remat: bool = False,
    micro_batch_size: int = 0,
    to_params: ToParams | None = None,
    scale: jax.Array | float = 1.0,
    gathered: Callable[[Any], tuple[Any, Any]] | None = None,
) -> tuple[jax.Array, Any]:
    """(sft_loss, its gradient w.r.t. lora) of a batch [B, T], optionally in micro-batches.
    `lora` is the trainable, the adapter or (with `to_params`) the weights (`lora.full`).

    micro_batch_size = 0 (or B): one pass. Else the B rows are split into B / micro_batch_size
    contiguous micro-batches under `lax.scan`, each adding the gradient of its NLL *sum*
    -sum(log p * m) to a float32-master accumulator, divided once by the batch's target count
    max(sum(m), 1): the gradient of the whole-batch mean, up to summation order, with one
    micro-batch's activations alive at a time.

    Returns (loss, d (scale x loss) / d lora): `scale` (a data-parallel device's weight) enters
    before differentiation, as FSDP sums the gradient over devices inside the backward pass.
    `gathered` (FSDP, `mesh.gather_outside_layers` bound to the weights' specs): the weights
    are split over ``data`` and gathered, each layer inside the layer scan.
    """
    B = tokens.shape[0]

    def inputs(trainable):  # (weights, adapter, layer gather) of the model
        weights = model_weights(trainable, params, to_params)
        weights, gather = (weights, None) if gathered is None else gathered(weights)
        return weights, None if to_params else trainable, gather

    if not micro_batch_size or micro_batch_size == B:

        def loss(trainable):
            weights, adapter, gather = inputs(trainable)
            val = sft_loss(adapter, weights, model_config, tokens, mask, loss_mask, remat, gather)
            return scale * val, val

        grads, val = jax.grad(loss, has_aux=True)(lora)
        return val, grads
    if micro_batch_size < 0 or B % micro_batch_size:
        raise ValueError(f"sft micro_batch_size={micro_batch_size} must divide the batch size {B}")
    n = B // micro_batch_size
    split = lambda x: x.reshape(n, micro_batch_size, *x.shape[1:])  # noqa: E731

    denom = jnp.maximum(jnp.sum(loss_mask[:, 1:].astype(jnp.float32)), 1.0)

    def nll_sum(trainable, tok, m, lm):
        weights, adapter, gather = inputs(trainable)
        lp = sequence_logprobs(
            weights, model_config, tok, m, lora=adapter, remat=remat, gather=gather
        )
        val = -jnp.sum(lp * lm[:, 1:].astype(jnp.float32))
        return (scale / denom) * val, val

    def micro(acc, xs):
        loss_sum, grad_sum = acc
        g, val = jax.grad(nll_sum, has_aux=True)(lora, *xs)
        return (loss_sum + val, jax.tree.map(lambda a, b: a + b.astype(a.dtype), grad_sum, g)), None

    # float32 accumulators whatever the trainable's dtype (ZeRO differentiates the bf16 copy).
    zero = (
        jnp.zeros((), jnp.float32),
        jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), lora),
    )
    (loss_sum, grad_sum), _ = jax.lax.scan(
        micro, zero, (split(tokens), split(mask), split(loss_mask))
    )
    return loss_sum / denom, grad_sum


@functools.partial(
    jax.jit,
    static_argnames=("model_config", "optimizer", "remat", "micro_batch_size", "mesh", "to_params"),
    donate_argnums=(0, 1),
)
def sft_step(
    lora,
    opt_state,
    params,
    model_config,
    optimizer,
    tokens,
    mask,
    loss_mask,
    remat: bool = False,
    micro_batch_size: int = 0,
    mesh: Mesh | None = None,
    to_params: ToParams | None = None,
):
    """One AdamW step on a batch; returns (lora, opt_state, metrics).

    `lora` is the trainable: the adapter, or with `to_params` (static; `lora.full.merge_weights`)
    the float32 master weights of full-parameter training, run as `to_params(lora, params)`
    with no adapter.

    lora and opt_state are donated; tokens, mask, loss_mask [B, T]. `remat` and
    `micro_batch_size` as in `sft_loss_and_grad` (static). Lowerable ahead of time with
    `jax.ShapeDtypeStruct` arguments (the memory planner). `mesh` (static): data-parallel over
    its ``data`` axis (B a multiple of it, micro_batch_size rows per device); None = one device.

    Data-parallel, each device runs `sft_loss_and_grad` on its rows (`mesh.over_data`, the
    shard_map of the GRPO programs), then one psum adds the device losses / gradients weighed by
    w_d = max(N_d, 1) / max(N, 1), N_d / N the target tokens of device d / of the batch, so the
    result is the whole batch's mean NLL over its N tokens (to summation order).

    Full-parameter on a data axis > 1 (ZeRO-3 / FSDP, as `rl.programs`): the masters and AdamW
    state come split over ``data`` (`rl.placement.zero_placement`), and the shard_map receives
    their bf16 copy (`lora.full.compute_copy`) and the base split as well; the non-layer leaves
    are gathered once, each layer inside the layer scan (`mesh.gather_outside_layers`), whose
    transpose reduce-scatters the gradient back to the shards per layer and micro-batch.
    """
    zero = mesh is not None and to_params is not None and axis_size(mesh, DATA_AXIS) > 1
    specs = zero_specs(lora, mesh, model_config) if zero else None
    gathered = None
    if zero:
        base_specs = zero_specs(params, mesh, model_config)
        gathered = functools.partial(gather_outside_layers, specs=base_specs, mesh=mesh)

    def body(lora, params, tokens, mask, loss_mask):
        # this device's weight in the batch mean (1 on one device)
        w = 1.0
        if mesh is not None:
            count = jnp.sum(loss_mask[:, 1:].astype(jnp.float32))
            w = jnp.maximum(count, 1.0) / jnp.maximum(data_psum(count, mesh), 1.0)
        loss, grads = sft_loss_and_grad(
            lora,
            params,
            model_config,
            tokens,
            mask,
            loss_mask,
            remat=remat,
            micro_batch_size=micro_batch_size,
            to_params=to_params,
            scale=w,
            gathered=gathered,
        )
        if mesh is None:
            return loss, grads
        grads = jax.tree.map(lambda g: g.astype(jnp.float32), grads)
        if zero:  # split leaves summed by their gathers' transposes
            return data_psum(w * loss, mesh), data_psum_unsplit(grads, specs, mesh)
        return data_psum((w * loss, grads), mesh)

    trainable = lora
    if mesh is not None:
        rows = P(DATA_AXIS)
        grad_specs = jax.tree.map(data_only, specs) if zero else P()
        param_in = jax.tree.map(data_only, base_specs) if zero else P()
        body = over_data(body, mesh, (grad_specs, param_in, rows, rows, rows), (P(), grad_specs))
        if zero:
            trainable = compute_copy(lora, params)
    loss, grads = body(trainable, params, tokens, mask, loss_mask)
    updates, opt_state = optimizer.update(grads, opt_state, lora)
    lora = optax.apply_updates(lora, updates)
    if zero:  # the new state keeps the old one's shards
        t_sh, o_sh = zero_placement(lora, opt_state, optimizer, mesh, model_config)
        lora = jax.lax.with_sharding_constraint(lora, t_sh)
        opt_state = jax.lax.with_sharding_constraint(opt_state, o_sh)
    return lora, opt_state, {"loss": loss, "grad_norm": optax.tree.norm(grads)}


def train_sft(
    lora: Any,
    params: Any,
    model_config: Any,
    data: PromptSet,
    sft_config: Any,
    *,
    seed: int,
    pad_id: int,
    log_fn=None,
    remat: bool = False,
    mesh: Mesh | None = None,
    to_params: ToParams | None = None,
    eval_fn: Callable[[int, Any], float] | None = None,
) -> Any:
    """`sft_config.steps` AdamW steps of batch `sft_config.batch_size`; returns the trained LoRA.

    Early stopping (`eval_fn`, with `sft_config.eval_every` > 0): every `eval_every` steps and
    after the last, `eval_fn(step, lora)` scores a local copy of the LoRA (higher is better: the
    pipeline's greedy validation accuracy); the LoRA of the best score (ties: the earlier step) is
    returned, and training ends after `sft_config.patience` (> 0) scores in a row without
    improvement. Prechelt, "Early stopping - but when?" (1998): keep the best, stop on patience.

    The LoRA is trained (and returned) as a float32 master copy (`master_weights`) whatever its
    and the model's dtype; `sft_config.micro_batch_size` (0 = whole batch, absent = 0) splits each
    step's gradient; `remat` checkpoints each decoder layer (`config.model.remat`).
    `log_fn(step, metrics)` is called after every step with python floats.

    mesh: data-parallel over its ``data`` axis (every process calls this with the same
    arguments): each batch is padded to the axis with copies of its row 0 carrying no loss
    (`mesh.pad_to`'s rule), sharded, and `micro_batch_size` counts rows per device; the base
    weights are placed once (`rl.place_base`) and the LoRA comes back as a local copy.

    to_params: full-parameter SFT (`lora.full`): `lora` is then `full_policy`'s trainable (the
    weights' float32 masters) and `to_params` its `merge_weights`.
    """
    tokens, mask, loss_mask = sft_sequences(data, pad_id)
    optimizer = make_optimizer(
        float(sft_config.learning_rate),
        float(sft_config.weight_decay),
        float(sft_config.max_grad_norm),
    )
    full = mesh is not None and to_params is not None and axis_size(mesh, DATA_AXIS) > 1
    if full:  # ZeRO: masters and AdamW state made on their shards
        lora, opt_state = zero_init(lora, optimizer, mesh, model_config)
    else:
        lora = master_weights(lora)
        if to_params is not None:
            # `full_policy`'s trainable is the base's own arrays, which `master_weights` keeps
            # when they are float32 already; `sft_step` donates its trainable, so training them
            # in place would delete the base (the KL reference, the frozen leaves, what every
            # later program merges into): train a copy.
            lora = jax.tree.map(jnp.copy, lora)
        opt_state = optimizer.init(lora)
    micro_batch_size = int(getattr(sft_config, "micro_batch_size", 0))
    batch_size = int(sft_config.batch_size)
    padded = padded_size(batch_size, axis_size(mesh, DATA_AXIS))
    if mesh is not None:
        valid = rows_per_device_problem(
            micro_batch_size,
            batch_size,
            axis_size(mesh, DATA_AXIS),
            "rows",
            f"a batch of {batch_size}",
        )
        if valid is not None:
            raise ValueError(
                f"sft.micro_batch_size={micro_batch_size} is invalid: valid are {valid}"
            )
        # ZeRO (full-parameter): the base split over data too (sft_step)
        params = place_base(params, mesh, model_config, shard_data=to_params is not None)
        lora, opt_state = on_mesh((lora, opt_state), mesh)
    cursor = init_cursor(len(data), seed)
    eval_every = int(getattr(sft_config, "eval_every", 0)) if eval_fn is not None else 0
    patience = int(getattr(sft_config, "patience", 0))
    best: tuple[float, Any] | None = None
    since_best = 0
    for step in range(sft_config.steps):
        idx, cursor = next_indices(cursor, batch_size)
        batch = (tokens[idx], mask[idx], loss_mask[idx])
        if mesh is not None:
            rows = np.concatenate([idx, np.full(padded - batch_size, idx[0])])
            real = (np.arange(padded) < batch_size)[:, None]
            batch = place((tokens[rows], mask[rows], loss_mask[rows] * real), mesh, P(DATA_AXIS))
        lora, opt_state, m = sft_step(
            lora,
            opt_state,
            params,
            model_config,
            optimizer,
            *batch,
            remat=remat,
            micro_batch_size=micro_batch_size,
            mesh=mesh,
            to_params=to_params,
        )
        if log_fn is not None:
            log_fn(step + 1, {k: float(v) for k, v in m.items()})
        if eval_every and ((step + 1) % eval_every == 0 or step + 1 == sft_config.steps):
            # A copy that the next step's donation cannot delete.
            local = _local_copy(lora, mesh)
            score = float(eval_fn(step + 1, local))
            if best is None or score > best[0]:
                best, since_best = (score, local), 0
            else:
                since_best += 1
                if patience and since_best >= patience:
                    break
    if best is not None:
        return best[1]
    return _local_copy(lora, mesh) if mesh is not None else lora


def _local_copy(lora: Any, mesh: Mesh | None) -> Any:
    """A one-device copy of `lora` (from the mesh when there is one): held-out evaluation and the
    next method's init run on one device."""
    if mesh is not None:
        return jax.tree.map(jnp.asarray, host_copy(lora))
    return jax.tree.map(jnp.copy, lora)
