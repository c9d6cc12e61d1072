"""The one device mesh of every program, the one padding rule, and host values placed on it.

Every compiled program of a run (population generation, and later held-out evaluation, SFT and GRPO
steps) runs on a mesh built by `make_mesh`, with the same three axis names (docs/ARCHITECTURE.md,
"Meshes"):

- ``pop``: ESSA population members. ESSA distributes candidates, not weights (arXiv 2507.04453,
  Sec. 3): each device generates for its slice of members against shared base weights;
- ``data``: prompts (a member's mini-batch, or a GRPO batch);
- ``model``: tensor parallelism (Megatron-style, Shoeybi et al. 2019, arXiv 1909.08053): the base
  weights and the KV cache's heads are split over it by `param_specs` (the one sharding vocabulary
  of model weights) and placed with `place_params`.

Why tensor parallelism and not FSDP for the model axis: this library's hot path is decoding
(population generation, held-out evaluation), and a decode step is weight-bandwidth bound (every
step reads every weight once for a handful of tokens per row). FSDP would all-gather each layer's
weights at every decode step, moving the whole model over the interconnect per token; TP keeps
each device reading only its 1/model shard of the weights and of the KV cache, at the cost of one
all-reduce of the activations `[rows, d]` after attention and one after the MLP per layer.

Axis types are Auto (sharding propagation decides the layout of intermediate values; the
population program fixes its own with shard_map). The device order is `jax.devices()`' (process-
major), so each process's devices hold a contiguous block of members: a process reads back and
scores only its own rows.

Padding (the one rule of the library): a size that does not divide its mesh axis is padded up to
the next multiple with copies of entry 0 (member 0, prompt 0); padded rows are computed and then
dropped before any result leaves the program's caller. Pick P divisible by the ``pop`` axis (and
B by ``data``) to waste nothing.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

POP_AXIS = "pop"
DATA_AXIS = "data"
MODEL_AXIS = "model"
AXES = (POP_AXIS, DATA_AXIS, MODEL_AXIS)


def make_mesh(
    *,
    pop: int | None = None,
    data: int = 1,
    model: int = 1,
    devices: Sequence[jax.Device] | None = None,
) -> Mesh:
    """A (pop, data, model) mesh with Auto axis types over `devices` (default: every process's).

    Args:
      pop: devices along the population axis; default all devices / (data * model).
      data: devices along the prompt axis.
      model: devices along the model (tensor-parallel) axis.
      devices: the devices, in mesh order (default `jax.devices()`); the first pop * data * model
        are used.

    Raises ValueError naming the axis and the valid values when the devices do not fit.
    """
    devs = list(jax.devices() if devices is None else devices)
    n = len(devs)
    for name, size in (("data", data), ("model", model)):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"mesh {name}={size!r} is invalid: valid values are integers >= 1")
    if n % (data * model):
        raise ValueError(
            f"mesh data={data} x model={model} does not divide the {n} devices; valid: "
            f"data * model in {[d for d in range(1, n + 1) if n % d == 0]}"
        )
    if pop is None:
        pop = n // (data * model)
    if isinstance(pop, bool) or not isinstance(pop, int) or pop < 1 or pop * data * model > n:
        raise ValueError(
            f"mesh pop={pop!r} x data={data} x model={model} needs more than the {n} devices "
            f"available; valid pop values: 1..{n // (data * model)}"
        )
    grid = np.asarray(devs[: pop * data * model], dtype=object).reshape(pop, data, model)
    return Mesh(grid, AXES, axis_types=(AxisType.Auto,) * 3)


def axis_size(mesh: Mesh | None, axis: str) -> int:
    """Size of `axis` in `mesh`; 1 without a mesh or when the mesh lacks the axis."""
    if mesh is None or axis not in mesh.shape:
        return 1
    return int(mesh.shape[axis])


def padded_size(n: int, multiple: int) -> int:
    """Smallest multiple of `multiple` that is >= n."""
    return -(-n // multiple) * multiple


def pad_to(x: jax.Array, size: int, axis: int = 0) -> jax.Array:
    """`x` padded along `axis` to `size` with copies of its entry 0 (the one padding rule)."""
    n = x.shape[axis]
    if n == size:
        return x
    if n > size:
        raise ValueError(f"cannot pad an axis of {n} entries down to {size}")
    first = jax.lax.slice_in_dim(x, 0, 1, axis=axis)
    return jnp.concatenate([x, jnp.repeat(first, size - n, axis=axis)], axis=axis)


def place(tree: Any, mesh: Mesh, spec: PartitionSpec | None = None) -> Any:
    """A pytree that every process holds identically (base weights, the SVD basis, a population
    regenerated from the shared key) as global arrays on `mesh` with `spec` (default replicated).

    Nothing travels between processes: each fills its own devices' shards from its local copy.
    Do this once for the weights: a jitted call would otherwise transfer them on every call.
    """
    sharding = NamedSharding(mesh, PartitionSpec() if spec is None else spec)
    if jax.process_count() == 1:
        return jax.device_put(tree, sharding)

    def put(x: Any) -> jax.Array:
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])

    return jax.tree.map(put, tree)


def on_mesh(tree: Any, mesh: Mesh) -> Any:
    """`tree` as global arrays on `mesh`: leaves already spread over exactly the mesh's devices
    (replicated, or split over ``model`` by `place_params`) are kept, `jax.ShapeDtypeStruct`s get
    the replicated sharding (for lowering ahead of time), others are placed replicated (`place`:
    every process holds them identically, nothing travels). The inputs of the population program
    and of the data-parallel GRPO / SFT programs.

    A leaf on a one-device mesh's device with another kind of sharding (a plain array's
    `SingleDeviceSharding`) gets the mesh's replicated `NamedSharding`: a jitted program's cache
    is keyed by its inputs' shardings and its outputs come back with the mesh's, so a state that
    entered with the other kind would compile every program a second time at the next step
    (measured on SmolLM2: ~10 s per GRPO step program, 2026-12-06)."""
    devices = set(mesh.devices.flat)
    replicated = NamedSharding(mesh, PartitionSpec())

    def put(x: Any) -> Any:
        if isinstance(x, jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated)
        if isinstance(x, jax.Array) and x.sharding.device_set == devices:
            if isinstance(x.sharding, NamedSharding):
                return x
            return jax.device_put(x, replicated)  # one device: the same buffer, the mesh's name
        return place(x, mesh)

    return jax.tree.map(put, tree)


# -- model weights over the model axis ------------------------------------------------------------
#
# Kernels are [L, in, out] (stacked layers; `essa_jax.models.transformer`'s params layout).
# Column-parallel (output features split: each device computes its heads / MLP columns):
_COLUMN_PARALLEL = ("q", "k", "v", "gate", "up")
# Row-parallel (input features split: each device's partial product, summed by one all-reduce):
_ROW_PARALLEL = ("o", "down")


def model_axis_values(model_config: Any, num_devices: int | None = None) -> list[int]:
    """The valid sizes of the ``model`` axis for a model: the common divisors of num_heads,
    num_kv_heads and intermediate_size (and of `num_devices` when given).

    `model_config` is duck-typed (any object with those fields, e.g. `models.ModelConfig`): this
    module is layer 0 and imports no model code.
    """
    n = math.gcd(
        int(model_config.num_heads),
        int(model_config.num_kv_heads),
        int(model_config.intermediate_size),
    )
    if num_devices is not None:
        n = math.gcd(n, int(num_devices))
    return [m for m in range(1, n + 1) if n % m == 0]


def check_model_axis(model_config: Any, model: int) -> None:
    """Raise ValueError unless `model` devices can split this model's heads and MLP columns.

    Each device holds num_heads / model query heads, num_kv_heads / model KV heads (their query
    groups with them: query head j reads KV head j // (num_heads / num_kv_heads), so contiguous
    blocks of both stay together) and intermediate_size / model MLP columns. KV heads are never
    replicated: model must divide num_kv_heads too, so every device's KV cache is exactly 1/model
    of it (GQA models with few KV heads, e.g. Qwen2.5-7B's 4, cap the axis there).
    """
    valid = model_axis_values(model_config)
    if isinstance(model, bool) or not isinstance(model, int) or model not in valid:
        raise ValueError(
            f"mesh.model={model!r} does not divide the model's heads: num_heads="
            f"{model_config.num_heads}, num_kv_heads={model_config.num_kv_heads}, "
            f"intermediate_size={model_config.intermediate_size}; valid mesh.model values: {valid}"
        )


def _leaf_spec(
    names: tuple[str, ...], ndim: int, model_config: Any, model: int, shape: tuple = ()
) -> PartitionSpec:
    """The spec of one params leaf from its path of dict keys (see `param_specs`)."""
    if model == 1:
        return PartitionSpec()
    m = MODEL_AXIS
    if names == ("embed",):
        # [V, d]: vocabulary-parallel (Megatron's VocabParallelEmbedding): the lookup is a local
        # masked gather plus one all-reduce of [rows, d]; tied, its transpose is the
        # column-parallel output head. A vocabulary the axis does not divide splits d instead.
        if model_config.vocab_size % model == 0:
            return PartitionSpec(m, None)
        return PartitionSpec(None, m) if model_config.hidden_size % model == 0 else PartitionSpec()
    if names == ("lm_head", "kernel"):
        # [d, V]: column-parallel over the vocabulary (logits come out split over V).
        if model_config.vocab_size % model == 0:
            return PartitionSpec(None, m)
        return PartitionSpec(m, None) if model_config.hidden_size % model == 0 else PartitionSpec()
    if len(names) > 3 and names[0] == "layers" and names[2] == "kernel":
        # A quantised kernel (`models.quant.QuantizedKernel`): its integers [L, in, out] split as
        # the float kernel; scales / offsets [L, in / tile, out] too, except a row-parallel axis
        # of per-channel scales (in / tile = 1), which every device needs whole.
        kernel = _leaf_spec(names[:3], len(shape), model_config, model, shape)
        if names[-1] != "qvalue" and shape[-2] % model:
            return PartitionSpec(*kernel[:-2], None, kernel[-1])
        return kernel
    if len(names) == 3 and names[0] == "layers":
        proj, kind = names[1], names[2]
        if proj in _COLUMN_PARALLEL and kind == "kernel":
            return PartitionSpec(*([None] * (ndim - 1)), m)  # [L, in, out/model]
        if proj in _COLUMN_PARALLEL and kind == "bias":
            return PartitionSpec(*([None] * (ndim - 1)), m)  # [L, out/model]
        if proj in _ROW_PARALLEL and kind == "kernel":
            return PartitionSpec(*([None] * (ndim - 2)), m, None)  # [L, in/model, out]
    # Norms (and row-parallel biases, which this architecture has none of): replicated.
    return PartitionSpec()


def _with_data(
    names: tuple[str, ...], spec: PartitionSpec, shape: tuple, data: int
) -> PartitionSpec:
    """`spec` with the ``data`` axis on the largest dimension it leaves free that `data` divides
    (never a stacked leaf's layer axis, which the layer scan slices); unchanged when none."""
    if data == 1:
        return spec
    entries = list(spec) + [None] * (len(shape) - len(spec))
    first = 1 if names and names[0] == "layers" else 0
    free = [k for k in range(first, len(shape)) if entries[k] is None and shape[k] % data == 0]
    if not free:
        return spec
    k = max(free, key=lambda i: (shape[i], i))
    entries[k] = DATA_AXIS
    return PartitionSpec(*entries)


def data_dim(spec: PartitionSpec) -> int | None:
    """The dimension `spec` splits over ``data`` (`param_specs(..., data=)`), or None."""
    return next((k for k, e in enumerate(spec) if e == DATA_AXIS), None)


def param_specs(params: Any, model_config: Any, model: int, data: int = 1) -> Any:
    """The `PartitionSpec` of every leaf of a params pytree for a ``model`` axis of `model` devices
    and, with `data` > 1, sharded over the ``data`` axis too (FSDP / ZeRO, Rajbhandari et al. 2020,
    arXiv 1910.02054: each of `data` devices holds 1/data of a leaf; what full-parameter
    training's float32 masters, AdamW state and base are placed with, `rl.placement`).

    The one sharding vocabulary of model weights (Megatron-style tensor parallelism, Shoeybi et
    al. 2019, arXiv 1909.08053, Sec. 3):

    | leaf | shape | spec |
    |---|---|---|
    | embed | [V, d] | (model, None): vocabulary-parallel |
    | layers.{q,k,v,gate,up}.kernel | [L, d, out] | (None, None, model): column-parallel |
    | layers.{q,k,v}.bias | [L, out] | (None, model) |
    | layers.{o,down}.kernel | [L, in, d] | (None, model, None): row-parallel |
    | lm_head.kernel | [d, V] | (None, model): column-parallel over V |
    | norms | [L, d], [d] | replicated |

    (A vocabulary that `model` does not divide splits the embedding / lm_head over d instead.)
    ``data`` then takes the largest dimension left free that it divides, never a stacked leaf's
    layer axis L (the layer scan slices it): the kernels' d or out / in, the embedding's d, the
    norms' d (`data_dim` reads it back); a leaf with no such dimension stays replicated over it.
    Leaves may be arrays or `jax.ShapeDtypeStruct`s; `model` = `data` = 1 gives replicated specs.
    Raises ValueError (`check_model_axis`) when `model` does not divide the heads.
    """
    if model != 1:
        check_model_axis(model_config, model)

    def spec(path: tuple, leaf: Any) -> PartitionSpec:
        names = tuple(str(getattr(k, "key", getattr(k, "name", k))) for k in path)
        shape = tuple(leaf.shape)
        return _with_data(
            names, _leaf_spec(names, len(shape), model_config, model, shape), shape, data
        )

    return jax.tree_util.tree_map_with_path(spec, params)


def place_params(params: Any, mesh: Mesh, model_config: Any, *, shard_data: bool = False) -> Any:
    """Base weights on `mesh`, split over its ``model`` axis by `param_specs` and replicated over
    ``pop`` and ``data`` (`shard_data`: split over ``data`` too, full-parameter training's
    layout); abstract leaves (`jax.ShapeDtypeStruct`) get the same shardings (for lowering a
    program ahead of time). Multi-process like `place`: each process fills its own devices'
    shards from its identical host copy."""
    data = axis_size(mesh, DATA_AXIS) if shard_data else 1
    specs = param_specs(params, model_config, axis_size(mesh, MODEL_AXIS), data)

    def put(x: Any, spec: PartitionSpec) -> Any:
        if isinstance(x, jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, spec))
        return place(x, mesh, spec)

    return jax.tree.map(put, params, specs)


# -- programs manual over the data axis ------------------------------------------------------------


def over_data(body: Any, mesh: Mesh, in_specs: Any, out_specs: Any) -> Any:
    """`body` once per block of rows: `jax.shard_map` manual over ``data`` alone, so ``model``
    stays Auto (weights split over it by `place_params` stay split and the layers run tensor-
    parallel inside, as in `population.engine`). The one shard_map of the data-parallel GRPO and
    SFT programs (docs/ARCHITECTURE.md, "Data-parallel GRPO and SFT"). On a mesh of one device it
    is `body` itself: one block of rows is all the rows, and the bodies call their collectives
    through `data_psum` / `data_all_gather`, the identity on a data axis of one device, so the
    compiled program is the plain single-device one (no collective, no copy, the same numbers)."""
    if mesh.devices.size == 1:
        return body
    return jax.shard_map(
        body,
        mesh=mesh,
        in_specs=in_specs,
        out_specs=out_specs,
        axis_names=frozenset({DATA_AXIS}),
        # generate writes per-shard values into a jnp.zeros KV cache inside while_loop, which vma
        # checking rejects (as in population.engine); the bodies' collectives are explicit.
        check_vma=False,
    )


def data_psum(tree: Any, mesh: Mesh) -> Any:
    """psum over ``data`` inside `over_data`; the tree itself on a data axis of one device (no
    all-reduce in the compiled program)."""
    return tree if axis_size(mesh, DATA_AXIS) == 1 else jax.lax.psum(tree, DATA_AXIS)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _gather_leaf(x: jax.Array, k: int) -> jax.Array:
    """Tiled all_gather of `x` over ``data`` along dimension k (see `data_gather`)."""
    return jax.lax.all_gather(x, DATA_AXIS, axis=k, tiled=True)


def _gather_leaf_fwd(x: jax.Array, k: int) -> tuple[jax.Array, None]:
    return _gather_leaf(x, k), None


def _reduce_scatter_f32(ct: jax.Array, k: int) -> jax.Array:
    # The all_gather's transpose, a reduce-scatter, summed in float32 whatever the compute dtype
    # (FSDP's float32 gradient reduction: a bf16 ring sum rounds at every hop; XLA's CPU
    # compiler also fails on a bf16 reduce-scatter inside the layer loop), rounded once after.
    summed = jax.lax.psum_scatter(
        ct.astype(jnp.float32), DATA_AXIS, scatter_dimension=k, tiled=True
    )
    return summed.astype(ct.dtype)


def _gather_leaf_bwd(k: int, _: None, ct: jax.Array) -> tuple[jax.Array]:
    return (_reduce_scatter_f32(ct, k),)


_gather_leaf.defvjp(_gather_leaf_fwd, _gather_leaf_bwd)


def _on_model_shards(fn: Any, local: PartitionSpec) -> Any:
    """`fn` on each device's ``model`` shard (manual over ``model`` as well, inside `over_data`):
    a collective over ``data`` then moves only that shard."""
    return jax.shard_map(
        fn,
        mesh=jax.sharding.get_abstract_mesh(),
        in_specs=local,
        out_specs=local,
        axis_names=frozenset({MODEL_AXIS}),
        check_vma=False,
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _gather_split(x: jax.Array, k: int, local: PartitionSpec) -> jax.Array:
    """`_gather_leaf` of a leaf that ``model`` splits as `local`, shard by shard."""

    def gather(a: jax.Array) -> jax.Array:
        return jax.lax.all_gather(a, DATA_AXIS, axis=k, tiled=True)

    return _on_model_shards(gather, local)(x)


def _gather_split_fwd(x: jax.Array, k: int, local: PartitionSpec) -> tuple[jax.Array, None]:
    return _gather_split(x, k, local), None


def _gather_split_bwd(k: int, local: PartitionSpec, _: None, ct: jax.Array) -> tuple[jax.Array]:
    return (_on_model_shards(lambda c: _reduce_scatter_f32(c, k), local)(ct),)


_gather_split.defvjp(_gather_split_fwd, _gather_split_bwd)


def data_gather(tree: Any, specs: Any, mesh: Mesh) -> Any:
    """Inside `over_data`: every leaf split over ``data`` (its spec from `param_specs(...,
    data=)`, `data_dim`) all-gathered whole along that dimension; leaves it leaves whole pass
    through. The tree itself on a data axis of one device.

    Differentiable: its transpose reduce-scatters each leaf's cotangent back to this device's
    shard, summed over every device of ``data`` (in float32, rounded once to the leaf's dtype),
    so the gradient w.r.t. a split leaf arrives already reduced (FSDP / ZeRO-3, Rajbhandari et
    al. 2020, arXiv 1910.02054, Sec. 5.3); a leaf left whole gets this device's own gradient
    (`data_psum_unsplit` sums it).
    """
    if axis_size(mesh, DATA_AXIS) == 1:
        return tree

    split_model = axis_size(mesh, MODEL_AXIS) > 1

    def one(x: jax.Array, spec: PartitionSpec) -> jax.Array:
        k = data_dim(spec)
        if k is None:
            return x
        if not split_model:
            return _gather_leaf(x, k)
        # Manual over ``model`` too, for the gather alone: in a program manual over ``data``
        # only, XLA first all-gathers an operand that the Auto ``model`` axis splits (a manual
        # axis's collective wants it whole over the others), so every device would hold, and
        # move, whole layers (the 32B plan: 4x the data-axis bytes, plus model-axis gathers;
        # tests/rl/test_fsdp_gather.py). Here each device gathers only its model shard.
        return _gather_split(x, k, PartitionSpec(*(None if e == DATA_AXIS else e for e in spec)))

    return jax.tree.map(one, tree, specs)


def data_psum_unsplit(tree: Any, specs: Any, mesh: Mesh) -> Any:
    """Inside `over_data`: the gradients of weights gathered by `data_gather`, completed: a psum
    over ``data`` of each leaf its spec leaves whole (its gather was the identity, so each device
    holds its own rows' gradient); a split leaf's gradient, already reduce-scattered by the
    gather's transpose, passes through. The tree itself on a data axis of one device."""
    if axis_size(mesh, DATA_AXIS) == 1:
        return tree

    def one(x: jax.Array, spec: PartitionSpec) -> jax.Array:
        return jax.lax.psum(x, DATA_AXIS) if data_dim(spec) is None else x

    return jax.tree.map(one, tree, specs)


def gather_outside_layers(weights: Any, specs: Any, mesh: Mesh) -> tuple[Any, Any]:
    """FSDP's weights of one program, inside `over_data`: `(weights, gather)` with every leaf
    but the stacked layers gathered whole once (`data_gather`: embedding, final norm, untied
    head; used before and after the layer scan) and `gather`, one layer's param dict (its leaves
    without the layer axis) -> the same layer gathered, for the model to call inside its layer
    scan (`models.transformer.hidden_states(gather=)`), so one layer's whole weights exist at a
    time. `specs`: `param_specs(..., data=)` of `weights` at their global shapes."""
    top = {k: v for k, v in weights.items() if k != "layers"}
    top = data_gather(top, {k: specs[k] for k in top}, mesh)
    # A stacked leaf's spec never splits the layer axis (`param_specs`): drop that entry.
    per_layer = jax.tree.map(lambda s: PartitionSpec(*s[1:]), specs["layers"])

    def gather(layer: Any) -> Any:
        return data_gather(layer, per_layer, mesh)

    return {**top, "layers": weights["layers"]}, gather


def data_only(spec: PartitionSpec) -> PartitionSpec:
    """`spec` with every axis but ``data`` dropped: the spec of an `over_data` input or output
    (manual over ``data`` alone; ``model`` follows the arrays' shardings)."""
    return PartitionSpec(*(e if e == DATA_AXIS else None for e in spec))


def data_all_gather(tree: Any, mesh: Mesh) -> Any:
    """Tiled all_gather over ``data`` inside `over_data` (every device's rows, in device order);
    the tree itself on a data axis of one device."""
    if axis_size(mesh, DATA_AXIS) == 1:
        return tree
    return jax.lax.all_gather(tree, DATA_AXIS, tiled=True)


def rows_per_device_problem(
    micro_batch_size: int, batch: int, data: int, unit: str, of: str
) -> str | None:
    """The one micro-batch rule: a micro-batch size counts rows per device, ceil(batch / data)
    (a batch is padded to the data axis, `pad_to`), and must be 0 (the whole) or divide them.

    Returns None when `micro_batch_size` is valid, else the valid values in words ("0 or a
    divisor of the 4 rows each of the data=8 devices holds of <of> ..."; `unit` names the rows,
    `of` the batch) for the caller's error naming its field (`config.check_micro_batches`,
    `rl.GRPOConfig.check_micro_batch`, `train.sft.train_sft`).
    """
    per_device = -(-batch // data)
    if not micro_batch_size or per_device % micro_batch_size == 0:
        return None
    if data == 1:
        return f"0 or a divisor of the {batch} {unit} of {of}"
    return (
        f"0 or a divisor of the {per_device} {unit} each of the data={data} devices holds of "
        f"{of} (micro_batch_size counts rows per device)"
    )


# -- rows generated on a mesh, back on the host ---------------------------------------------------


def local_blocks(
    arrays: Sequence[jax.Array], sizes: Sequence[int]
) -> list[tuple[tuple[int, ...], list[np.ndarray]]]:
    """The blocks of `arrays` (sharded alike over their leading len(sizes) axes, padded there by
    `pad_to`) that this process's devices hold: `(starts, [numpy block of each array])` for each
    replica-0 shard (a block held on several devices, e.g. over ``model``, is read once), clipped
    to the real `sizes` (blocks of padding only are dropped), in grid order.

    The one read-back of rows generated on a mesh: the population's [P_pad, B_pad] grid and
    GRPO's [R_pad] rollouts (docs/ARCHITECTURE.md, "The path of a genome", step 3).
    """
    k = len(sizes)
    blocks = []
    for group in zip(*(a.addressable_shards for a in arrays), strict=True):
        if group[0].replica_id != 0:
            continue
        bounds = [
            (sl.indices(full)[0], min(sl.indices(full)[1], real))
            for sl, full, real in zip(group[0].index[:k], arrays[0].shape[:k], sizes, strict=True)
        ]
        if any(lo >= hi for lo, hi in bounds):
            continue  # padding only
        cut = tuple(slice(0, hi - lo) for lo, hi in bounds)
        blocks.append((tuple(lo for lo, _ in bounds), [np.asarray(s.data)[cut] for s in group]))
    return sorted(blocks, key=lambda b: b[0])


def allgather_owned(values: np.ndarray, owned: np.ndarray) -> np.ndarray:
    """Per-process values [k, *grid], each entry filled by exactly one process (its replica-0
    holder, `owned` bool [*grid]), combined into the whole [k, *grid] on every process.

    A few floats per row cross processes (`multihost_utils.process_allgather`), never tokens.
    Raises RuntimeError when an entry was filled by none or several processes.
    """
    stacked = np.concatenate([values, owned[None].astype(values.dtype)])
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        every = np.asarray(multihost_utils.process_allgather(stacked, tiled=False))
    else:
        every = stacked[None]
    vals, own = every[:, :-1], every[:, -1:] > 0
    if not np.all(own.sum(axis=0) == 1):
        raise RuntimeError("rows generated on the mesh were read back by none or several processes")
    return np.where(own, vals, 0).sum(axis=0)


def host_copy(tree: Any) -> Any:
    """Every leaf of `tree` whole on this host (numpy): `device_get` of what this process can
    address, and an all-gather across processes of leaves split over several processes' devices
    (full-parameter training's ZeRO state, `rl.programs`); collective when any leaf needs it, so
    every process calls it with the same tree."""

    def whole(x: Any) -> Any:
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            from jax.experimental import multihost_utils

            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(jax.device_get(x))

    return jax.tree.map(whole, tree)
