"""Ahead-of-time memory plan: does every program of a run fit the target's devices?

    python -m essa_jax.plan --config experiments/configs/essa_qwen2p5_7b_gsm8k.py \
        --devices 8 --device_memory_gb 80 [--json plan.json]
    python -m essa_jax.plan --config ... --target tpu:v5e:4x4

Builds every compiled program that a run of the config uses (docs/ARCHITECTURE.md, "Planning
memory") from abstract inputs (`jax.ShapeDtypeStruct`: no weights, no data, nothing allocated),
compiles it for the target and reads XLA's own accounting: per-device argument / temporary / output
bytes (`compiled.memory_analysis()`) and FLOPs (`compiled.cost_analysis()`). This is how MaxText's
`train_compile` checks a configuration against a topology the machine does not have.

Programs (those the config's method runs):
  - `sft_step`: one LoRA SFT step (ESSA step 1, and the SFT before GRPO when `sft.steps` > 0);
  - `essa_population`: one generation's population program (P x B rows over the (pop, data, model)
    mesh, each shard in chunks of `essa.rows_per_chunk` rows);
  - `grpo_rollout`, `grpo_score` (only when old / reference log-probs are needed), `grpo_update`;
  - `heldout_eval`: one held-out generation batch (`eval.batch_size` prompts).

Targets:
  - `--devices N --device_memory_gb G`: the machine's own devices when it has N of them (e.g. a GPU
    node), else N virtual CPU devices. XLA's CPU compiler assigns buffers close to, not exactly as,
    the GPU compiler does: the output says which compiler produced the figures.
  - `--target tpu:<type>:<topology>` (e.g. `tpu:v5e:2x2`, `tpu:v5p:2x2x1`, `tpu:v6e:4x4`): abstract
    TPU devices from `libtpu` (`pip install essa_jax[tpu]`), compiled by XLA's TPU compiler: exact
    per-device bytes, on any machine.

The model's shape comes from `model.path`'s config.json (or GGUF header) when that exists, else from
`model.name` (`essa_jax.models.shapes`). A program fits when its per-device bytes leave `--headroom`
(default 10%) of the device's memory free (runtime, fragmentation, collective buffers). The command
exits 1 when one does not, naming the program and the settings that would make it fit.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

# Device memory of a TPU chip by type (public specifications), for --target tpu:...
TPU_MEMORY_GB = {"v4": 32, "v5e": 16, "v5litepod": 16, "v5p": 95, "v6e": 32}
_SINGLE_HOST_TYPE = {
    "v4": "v4-8",
    "v5e": "v5litepod-4",
    "v5litepod": "v5litepod-4",
    "v5p": "v5p-8",
    "v6e": "v6e-4",
}
DEFAULT_HEADROOM = 0.10
GB = 1e9


class PlanError(ValueError):
    """The plan cannot be made (bad target, unknown model shape, invalid config)."""


@dataclasses.dataclass(frozen=True)
class Target:
    """Where the programs are compiled for.

    name: e.g. "8 x 80 GB (virtual CPU devices)" or "tpu:v5e:2x2"; devices: the devices programs
    are laid out on (real, virtual CPU or abstract TPU); device_memory_bytes: per device;
    compiler: the XLA backend that assigned the buffers ("cpu", "gpu", "tpu").
    """

    name: str
    devices: tuple[Any, ...]
    device_memory_bytes: int
    compiler: str

    @property
    def num_devices(self) -> int:
        return len(self.devices)


def _tpu_target(spec: str) -> Target:
    from jax.experimental import topologies

    parts = spec.split(":")
    if len(parts) != 3 or parts[0] != "tpu":
        raise PlanError(f"--target {spec!r}: expected tpu:<type>:<topology>, e.g. tpu:v5e:4x4")
    _, kind, topology = parts
    if kind not in TPU_MEMORY_GB:
        raise PlanError(
            f"--target {spec!r}: unknown TPU type {kind!r}; known: {list(TPU_MEMORY_GB)}"
        )
    # Compiling for a topology needs no TPU, so no exclusive hold on one: without this, libtpu
    # refuses while any other process on the machine has it loaded.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    # On a host without TPUs, libtpu's start-up looks for this host's slice and prints a page of
    # warnings; naming a single-host slice of the same generation quiets it. The topology compiled
    # for is `topology_name`'s whatever this says (on a TPU VM the variable is already set).
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", _SINGLE_HOST_TYPE[kind])
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    try:
        topo = topologies.get_topology_desc(platform="tpu", topology_name=f"{kind}:{topology}")
    except Exception as e:  # libtpu missing, or a topology libtpu does not know
        hint = "" if _has_libtpu() else " (libtpu is not installed: pip install 'essa_jax[tpu]')"
        raise PlanError(f"--target {spec!r}: no TPU topology{hint}: {e}") from None
    return Target(
        name=spec,
        devices=tuple(topo.devices),
        device_memory_bytes=int(TPU_MEMORY_GB[kind] * 1e9),
        compiler="tpu",
    )


def _has_libtpu() -> bool:
    import importlib.util

    return importlib.util.find_spec("libtpu") is not None


def make_target(target: str | None, devices: int, device_memory_gb: float | None) -> Target:
    """The `Target` of the command line: a TPU topology, or N devices of G GB.

    With N devices: the default backend's own devices when there are at least N of them and they
    are not CPUs (real GPUs / TPUs), else N virtual CPU devices (`jax_num_cpu_devices`, which must
    be set before the first JAX computation: call this first).
    """
    if target:
        if not target.startswith("tpu:"):
            raise PlanError(f"--target {target!r}: expected tpu:<type>:<topology>")
        return _tpu_target(target)
    if not isinstance(devices, int) or devices < 1:
        raise PlanError(f"--devices {devices!r}: expected an integer >= 1")
    if device_memory_gb is None or device_memory_gb <= 0:
        raise PlanError("--device_memory_gb: expected the memory of one device in GB (> 0)")
    import jax

    # Never fewer CPU devices than the process asked for already (XLA_FLAGS): the setting holds
    # for the whole process, and others in it (a test session) may need them.
    asked = re.search(
        r"--xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", "")
    )
    try:
        jax.config.update("jax_num_cpu_devices", max(devices, int(asked[1]) if asked else 1))
    except RuntimeError:
        pass  # backend already started (in tests): use the CPU devices it has
    real = jax.devices()
    if real[0].platform != "cpu" and len(real) >= devices:
        devs, compiler = real[:devices], real[0].platform
        name = f"{devices} x {device_memory_gb:g} GB ({real[0].device_kind})"
    else:
        cpus = jax.devices("cpu")
        if len(cpus) < devices:
            raise PlanError(
                f"--devices {devices}: this process has {len(cpus)} CPU devices; run the plan in a "
                "fresh process (python -m essa_jax.plan) so that it can create the virtual devices"
            )
        devs, compiler = cpus[:devices], "cpu"
        name = f"{devices} x {device_memory_gb:g} GB (virtual CPU devices; CPU compiler)"
    return Target(name, tuple(devs), int(device_memory_gb * 1e9), compiler)


@dataclasses.dataclass
class ProgramPlan:
    """One compiled program's per-device footprint on the target (bytes; FLOPs per call).

    per_device_bytes = arguments + outputs + temporaries - aliased (donated) bytes, as XLA's buffer
    assignment counts them; fits: per_device_bytes <= (1 - headroom) * device_memory_bytes.
    chunks: the micro-batch sizes the program runs with (chosen from the budget when the config
    says 0). flops: XLA's cost analysis of one call, which counts a loop's body once, not once per
    trip (the layer scan, the decode loop, chunk maps): a lower bound. model_flops: the same call
    counted from the model's shape (`model_flops`): matmuls and attention of every token of the
    device's rows, divided over the model axis: the figure to set against a chip's peak.
    """

    config: str
    program: str
    target: str
    compiler: str
    devices: int
    mesh: dict[str, int]
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int
    per_device_bytes: int
    device_memory_bytes: int
    headroom: float
    fits: bool
    chunks: dict[str, int]
    flops: float
    model_flops: float
    compile_s: float
    fix: str = ""

    def row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class _Program:
    name: str
    lower: Callable[[], Any] | None  # -> jax.stages.Lowered; None: cannot fit, see `fix`
    mesh: dict[str, int]
    chunks: dict[str, int]
    fix: str  # the settings that shrink this program, for the "does not fit" message
    model_flops: float = 0.0


# -- model shape and abstract inputs --------------------------------------------------------------


def plan_model_config(config) -> tuple[Any, str]:
    """(ModelConfig, where its shape came from): model.path's config.json / GGUF header when it
    exists, else the built-in shape of model.name."""
    from essa_jax.config import UNSET, peek_model_config

    path = config.model.path
    if path and UNSET not in path:
        try:
            mc = peek_model_config(path)
        except (FileNotFoundError, OSError, ValueError):
            mc = None
        if mc is not None:
            return mc, f"model.path={path}"
    if config.model.name:
        from essa_jax.models.shapes import model_shape

        try:
            return model_shape(config.model.name), f"model.name={config.model.name}"
        except ValueError as e:
            raise PlanError(f"config.model.name: {e}") from None
    raise PlanError(
        f"no model shape: config.model.path={path!r} has no readable config.json and "
        "config.model.name is empty; set --config.model.name=<e.g. Qwen2.5-7B> "
        "(known shapes: essa_jax.models.shapes.MODEL_SHAPES)"
    )


def _remat(config) -> bool:
    return bool(config.model.remat)


def _abstract(tree: Any, sharding: Any) -> Any:
    import jax

    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


def _replicated(devices: Sequence[Any]) -> Any:
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.sharding.Mesh(np.asarray(devices, dtype=object), ("d",))
    return NamedSharding(mesh, PartitionSpec())


def model_flops(
    mc, rows: int, prompt: int, new: int = 0, *, train: bool = False, remat: bool = False
) -> float:
    """FLOPs of `rows` sequences of `prompt` tokens (+ `new` decoded ones) through the model.

    Per token: 2 x (projection kernels + output head) multiply-adds, plus attention's
    4 x layers x heads x head_dim x (keys attended), causal (a token at position t sees t + 1
    keys). Generation counts prefill and every decode step; training counts the forward, the
    backward's input gradients (as much again: the base weights are frozen, the LoRA weights'
    own gradients are negligible) and, with remat, a second forward.
    """
    dense = 2 * (
        mc.num_layers * sum(i * o for i, o in mc.projection_shapes().values())
        + mc.hidden_size * mc.vocab_size
    )
    attn = 4 * mc.num_layers * mc.num_heads * mc.head_dim
    total = prompt + new
    # Sum over positions t < total of (t + 1) keys = total (total + 1) / 2.
    keys = total * (total + 1) / 2
    forward = rows * (dense * total + attn * keys)
    if not train:
        return float(forward)
    return float(forward * (3 if remat else 2))


# -- the programs of a run ----------------------------------------------------------------------


def _dp_mesh(config, target: Target) -> Any:
    """The SFT / GRPO / evaluation mesh the run builds (`train.pipeline.data_parallel_mesh`) on the
    target's devices: (pop 1, data N / model, model); None on one device."""
    from essa_jax.mesh import make_mesh

    n = target.num_devices
    if n == 1:
        return None
    model = int(config.mesh.model)
    return make_mesh(pop=1, data=n // model, model=model, devices=target.devices)


def _mesh_sizes(mesh) -> dict[str, int]:
    if mesh is None:
        return {"devices": 1}
    return dict(zip(mesh.axis_names, mesh.devices.shape, strict=True))


def _programs(config, mc, target: Target) -> list[_Program]:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from essa_jax import lora as lora_lib
    from essa_jax.mesh import place_params
    from essa_jax.models import init_params
    from essa_jax.models.generate import generate_jit
    from essa_jax.train.pipeline import model_dtype

    # A plan is for accelerators: virtual CPU devices stand in for GPUs ("auto" = bfloat16).
    dtype = model_dtype(config.model.dtype, "gpu" if target.compiler == "cpu" else target.compiler)
    mesh = _dp_mesh(config, target)
    # Where the run keeps what every program shares: on one device without a mesh; replicated
    # over the mesh with the base weights split over its model axis (`mesh.place_params`).
    rep = _replicated(target.devices[:1]) if mesh is None else NamedSharding(mesh, PartitionSpec())
    params_shape = jax.eval_shape(lambda k: init_params(k, mc, dtype), jax.random.key(0))
    base = _abstract(params_shape, rep)
    if mesh is not None:
        base = place_params(params_shape, mesh, mc)
    # What runs after SFT reads the base in `model.quantize` form (`train.pipeline.
    # quantized_base`): int8 / int4 kernels and their scales, not float ones.
    infer_shape, infer_base = params_shape, base
    if config.model.quantize != "none":
        from essa_jax.models import quantize_params

        mode, group = config.model.quantize, int(config.model.quant_group)
        infer_shape = jax.eval_shape(lambda p: quantize_params(p, mode, group), params_shape)
        infer_base = _abstract(infer_shape, rep)
        if mesh is not None:
            infer_base = place_params(infer_shape, mesh, mc)
    lora_config = lora_lib.LoraConfig(
        rank=config.lora.rank, alpha=float(config.lora.alpha), targets=tuple(config.lora.targets)
    )
    # LoRA weights are float32 masters whatever the model's dtype (cast at use).
    lora_shape = jax.eval_shape(
        lambda k: lora_lib.init_lora(k, mc, lora_config, jnp.float32), jax.random.key(0)
    )
    tp = int(config.task.max_prompt_tokens)
    new = int(config.generation.max_new_tokens)
    eos = tuple(mc.eos_token_ids) or (0,)
    programs: list[_Program] = []

    # SFT: prompt + reference answer, at most max_prompt_tokens + max_new_tokens long.
    if config.method == "sft" or config.sft.steps > 0:
        sft_trainable = lora_shape
        if config.train.params != "lora":  # full-parameter SFT: the weights' float32 masters
            from essa_jax.lora.adapter import master_weights
            from essa_jax.lora.full import full_policy

            subset = config.train.params
            sft_trainable = jax.eval_shape(
                lambda p: master_weights(full_policy(p, subset)[0]), params_shape
            )
        programs.append(_sft_program(config, mc, base, sft_trainable, rep, mesh, tp + new))

    if config.method == "essa":
        programs.append(_essa_program(config, mc, infer_shape, lora_shape, target, tp, new, eos))
    elif config.method in ("grpo", "fgrpo", "svdgrpo"):
        programs += _grpo_programs(config, mc, infer_base, lora_shape, rep, mesh, tp, new, eos)

    # Held-out evaluation: one batch of eval.batch_size prompts, greedy (pass@k sampling runs the
    # same shapes with sampling on). The run evaluates with its weights as placed: on one device
    # when mesh.model = 1, tensor-parallel over the model axis otherwise.
    bs = min(int(config.eval.batch_size), int(config.task.num_heldout))
    tensor_parallel = mesh is not None and int(config.mesh.model) > 1
    ev_rep = rep if tensor_parallel else _replicated(target.devices[:1])
    ev_params = infer_base if tensor_parallel else _abstract(infer_shape, ev_rep)
    lora = _abstract(lora_shape, ev_rep)

    def lower_eval():
        tok = jax.ShapeDtypeStruct((bs, tp), jnp.int32, sharding=ev_rep)
        return generate_jit.lower(
            ev_params,
            mc,
            tok,
            tok,
            jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=ev_rep),
            max_new_tokens=new,
            greedy=True,
            lora=lora,
            eos_token_ids=eos,
            pad_token_id=mc.effective_pad_id,
        )

    programs.append(
        _Program(
            "heldout_eval",
            lower_eval,
            _mesh_sizes(mesh) if tensor_parallel else {"devices": 1},
            {"eval.batch_size": bs},
            f"a smaller eval.batch_size (now {bs}), or a larger mesh.model",
            model_flops(mc, bs, tp, new),
        )
    )
    return programs


def _sft_program(config, mc, base, lora_shape, rep, mesh, seq_len) -> _Program:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from essa_jax.lora.full import merge_weights
    from essa_jax.mesh import DATA_AXIS, axis_size, padded_size
    from essa_jax.train.sft import make_optimizer, sft_step

    optimizer = make_optimizer(
        float(config.sft.learning_rate),
        float(config.sft.weight_decay),
        float(config.sft.max_grad_norm),
    )
    opt_shape = jax.eval_shape(optimizer.init, lora_shape)
    b = int(config.sft.batch_size)
    data = axis_size(mesh, DATA_AXIS)
    padded = padded_size(b, data)
    rows = rep if mesh is None else NamedSharding(mesh, PartitionSpec(DATA_AXIS))
    micro = int(config.sft.micro_batch_size)

    def lower():
        tok = jax.ShapeDtypeStruct((padded, seq_len), jnp.int32, sharding=rows)
        return sft_step.lower(
            _abstract(lora_shape, rep),
            _abstract(opt_shape, rep),
            base,
            mc,
            optimizer,
            tok,
            tok,
            tok,
            remat=_remat(config),
            micro_batch_size=micro,
            mesh=mesh,
            to_params=None if config.train.params == "lora" else merge_weights,
        )

    per_device = padded // data
    return _Program(
        "sft_step",
        lower,
        _mesh_sizes(mesh),
        {"sft.batch_size": b, "sft.micro_batch_size": micro or per_device, "sequence": seq_len},
        "model.remat=True, a smaller sft.micro_batch_size (rows per device), or a larger "
        "mesh.model",
        model_flops(mc, per_device, seq_len, train=True, remat=_remat(config)),
    )


def _essa_program(config, mc, params_shape, lora_shape, target, tp, new, eos) -> _Program:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from essa_jax import lora as lora_lib
    from essa_jax.mesh import make_mesh
    from essa_jax.population.evaluator import PopulationEvaluator, PromptBatch

    c = config
    mesh = make_mesh(data=c.mesh.data, model=c.mesh.model, devices=target.devices)
    replicated = NamedSharding(mesh, PartitionSpec())
    basis, layout = lora_lib.basis_shape(lora_shape, float(c.essa.alpha))
    basis = _abstract(basis, replicated)
    p, b = int(c.essa.population_size), int(c.essa.prompts_per_candidate)
    shape = (p, b, tp) if c.essa.prompt_sampling == "per_candidate" else (b, tp)
    sizes = dict(zip(mesh.axis_names, mesh.devices.shape, strict=True))
    # The evaluator the ESSA loop builds (train/essa.py), on abstract weights and the target's
    # memory: the chunk it picks for essa.rows_per_chunk = 0 is the one the run would pick.
    evaluator = PopulationEvaluator(
        _abstract(params_shape, replicated),
        mc,
        layout,
        mesh=mesh,
        score=lambda rows: [],
        max_new_tokens=new,
        greedy=bool(c.essa.greedy),
        temperature=float(c.essa.temperature),
        eos_token_ids=eos,
        rows_per_chunk=int(c.essa.rows_per_chunk),
        device_memory_bytes=target.device_memory_bytes,
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
        return _Program("essa_population", None, sizes, {"rows_per_device": rows}, str(e))
    return _Program(
        "essa_population",
        lambda: evaluator.lower(basis, genomes, batch, key),
        sizes,
        {"rows_per_device": rows, "essa.rows_per_chunk": chunk},
        fix,
        model_flops(mc, rows, tp, new),
    )


def _grpo_programs(config, mc, base, lora_shape, rep, mesh, tp, new, eos) -> list[_Program]:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from essa_jax import lora as lora_lib
    from essa_jax.config import grpo_config
    from essa_jax.lora.adapter import master_weights
    from essa_jax.lora.full import full_policy, merge_weights, no_lora
    from essa_jax.mesh import DATA_AXIS, axis_size, padded_size, place_params
    from essa_jax.rl import FrozenPolicy, GRPOTrainer, RolloutBatch

    c = config
    cfg = grpo_config(c)
    full = c.train.params != "lora"
    if full:  # the weights' float32 masters; the base split over data too (as train/grpo.py)
        to_lora, frozen = no_lora, None
        trainable = jax.eval_shape(
            lambda p: master_weights(full_policy(p, c.train.params)[0]), base
        )
        if mesh is not None:
            base = place_params(base, mesh, mc, shard_data=True)
    elif c.method == "svdgrpo":
        basis, layout = lora_lib.basis_shape(lora_shape, float(c.essa.alpha))
        to_lora = lora_lib.genome_to_lora(layout)
        frozen = _abstract(basis, rep)
        trainable = jax.ShapeDtypeStruct((layout.size,), jnp.float32, sharding=rep)
    else:
        to_lora, frozen, trainable = lora_lib.plain_to_lora, None, _abstract(lora_shape, rep)
    # The trainer the GRPO loop builds (train/grpo.py): data-parallel over the run's mesh.
    trainer = GRPOTrainer(
        mc,
        cfg,
        to_lora=to_lora,
        reward_fn=lambda *a, **k: [],
        decode=str,
        eos_token_ids=eos,
        mesh=mesh,
        to_params=merge_weights if full else None,
    )
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
        opt_state = _abstract(opt_state, rep)
    num_prompts = int(c.grpo.batch_size) // int(c.grpo.group_size)
    rows, seq = int(c.grpo.batch_size), tp + new
    mb = rows // int(c.grpo.num_minibatches)
    data = axis_size(mesh, DATA_AXIS)
    sharded = rep if mesh is None else NamedSharding(mesh, PartitionSpec(DATA_AXIS))
    sizes = _mesh_sizes(mesh)

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
        _Program(
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
            _Program(
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
        _Program(
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
            model_flops(mc, mb_per_device, seq, train=True, remat=_remat(config)),
        )
    )
    return programs


# -- compile and account ------------------------------------------------------------------------


def plan_config(
    config,
    target: Target,
    *,
    name: str = "",
    headroom: float = DEFAULT_HEADROOM,
    programs: Sequence[str] | None = None,
    log: Callable[[str], None] | None = None,
) -> list[ProgramPlan]:
    """Compile every program of `config`'s run for `target`; one `ProgramPlan` per program.

    `programs` restricts the plan to these names. Raises PlanError when the config is invalid for
    the target (e.g. a mesh that does not divide its devices).
    """
    from essa_jax.config import ConfigError, validate_config
    from essa_jax.train.pipeline import check_data_parallel

    mc, _ = plan_model_config(config)
    try:
        validate_config(config, target.num_devices, model_config=mc)
        check_data_parallel(config, _dp_mesh(config, target))
    except ConfigError as e:
        raise PlanError(str(e)) from None
    from essa_jax.models.generate import decode_layers

    # Decode as accelerators run it (the layer scan), also when XLA's CPU compiler stands in for a
    # GPU's or the process's backend is CPU while compiling for a TPU topology.
    with decode_layers("scan"):
        return _compile_all(config, mc, target, name, headroom, programs, log)


def compiler_options(target: Target) -> dict[str, str]:
    """XLA options for compiling for `target`.

    XLA's CPU compiler has no bfloat16 matmul: it converts the operands to float32 (its
    float-normalization pass), and loop-invariant code motion then hoists the conversion of a
    whole stacked weight out of the layer loop, a float32 copy of the model (twice its bfloat16
    bytes) that a GPU or TPU, which multiply bfloat16 natively, never makes. When the CPU compiler
    stands in for a GPU's, that hoisting is off, so each conversion stays a temporary of one layer
    (or of the head, per decode step): still an overestimate, by about that much. The program is
    compiled, never run, so only its buffers matter.
    """
    if target.compiler == "cpu":
        return {"xla_disable_hlo_passes": "while-loop-invariant-code-motion"}
    return {}


def compiled_programs(
    config, mc, target: Target, programs: Sequence[str] | None = None
) -> Iterator[tuple[_Program, Any, float]]:
    """(program, compiled or None, compile seconds) of each of the run's programs for `target`,
    compiled with `compiler_options(target)`; None where the program was refused before compiling
    (`fix` says why). `programs` restricts to those names. Call it within
    `decode_layers("scan")`, as `plan_config` does: programs are traced as accelerators run them.
    """
    for prog in _programs(config, mc, target):
        if programs is not None and prog.name not in programs:
            continue
        if prog.lower is None:
            yield prog, None, 0.0
            continue
        t0 = time.perf_counter()
        compiled = prog.lower().compile(compiler_options=compiler_options(target))
        yield prog, compiled, time.perf_counter() - t0


def _compile_all(config, mc, target, name, headroom, programs, log) -> list[ProgramPlan]:
    out = []
    for prog, compiled, dt in compiled_programs(config, mc, target, programs):
        if compiled is None:
            plan = _row(prog, name, target, headroom)
        else:
            cost = compiled.cost_analysis()
            cost = cost[0] if isinstance(cost, list | tuple) else cost
            plan = _row(
                prog,
                name,
                target,
                headroom,
                memory=compiled.memory_analysis(),
                flops=float((cost or {}).get("flops", 0.0)),
                compile_s=round(dt, 2),
            )
        if log is not None:
            log(format_row(plan))
        out.append(plan)
    return out


def _row(
    prog: _Program,
    name: str,
    target: Target,
    headroom: float,
    memory: Any = None,
    flops: float = 0.0,
    compile_s: float = 0.0,
) -> ProgramPlan:
    """The `ProgramPlan` of `prog` from XLA's memory analysis; without one (a program refused
    before compiling) its bytes are 0 and it does not fit."""
    arg = int(memory.argument_size_in_bytes) if memory else 0
    outb = int(memory.output_size_in_bytes) if memory else 0
    tmp = int(memory.temp_size_in_bytes) if memory else 0
    alias = int(memory.alias_size_in_bytes) if memory else 0
    total = arg + outb + tmp - alias
    fits = memory is not None and total <= (1.0 - headroom) * target.device_memory_bytes
    return ProgramPlan(
        config=name,
        program=prog.name,
        target=target.name,
        compiler=target.compiler,
        devices=target.num_devices,
        mesh=prog.mesh,
        argument_bytes=arg,
        output_bytes=outb,
        temp_bytes=tmp,
        alias_bytes=alias,
        per_device_bytes=total,
        device_memory_bytes=target.device_memory_bytes,
        headroom=headroom,
        fits=fits,
        chunks=prog.chunks,
        flops=flops,
        # Tensor parallelism splits every matmul over the model axis.
        model_flops=float(prog.model_flops) / prog.mesh.get("model", 1) if memory else 0.0,
        compile_s=compile_s,
        fix="" if fits else prog.fix,
    )


def format_header() -> str:
    return (
        f"{'program':<16} {'mesh':<22} {'args GB':>9} {'temp GB':>9} {'out GB':>8} "
        f"{'total GB':>10} {'of GB':>7} {'fits':>5} {'TFLOP':>8}  chunks  (TFLOP: model_flops)"
    )


def format_row(p: ProgramPlan) -> str:
    mesh = "x".join(f"{k}{v}" for k, v in p.mesh.items())
    chunks = ", ".join(f"{k}={v}" for k, v in p.chunks.items())
    return (
        f"{p.program:<16} {mesh:<22} {p.argument_bytes / GB:>9.2f} {p.temp_bytes / GB:>9.2f} "
        f"{p.output_bytes / GB:>8.2f} {p.per_device_bytes / GB:>10.2f} "
        f"{p.device_memory_bytes / GB:>7.1f} {'yes' if p.fits else 'NO':>5} "
        f"{p.model_flops / 1e12:>8.1f}  {chunks}"
    )


def failure_message(p: ProgramPlan) -> str:
    """One line: which program does not fit, by how much, and what would make it fit."""
    budget = (1.0 - p.headroom) * p.device_memory_bytes
    if p.per_device_bytes == 0:  # refused before compiling; `fix` says why
        return f"{p.program} does not fit on {p.target}: {p.fix}"
    return (
        f"{p.program} does not fit: {p.per_device_bytes / GB:.1f} GB per device > "
        f"{budget / GB:.1f} GB ({1 - p.headroom:.0%} of {p.device_memory_bytes / GB:.1f} GB) "
        f"on {p.target}; try {p.fix}"
    )


# -- command line -------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m essa_jax.plan`: print the plan; exit 1 if a program does not fit, 2 on bad
    input."""
    from absl import flags
    from ml_collections import config_flags

    argv = list(sys.argv if argv is None else argv)
    fv = flags.FlagValues()
    holder = config_flags.DEFINE_config_file(
        "config", None, "Experiment config file.", flag_values=fv, lock_config=True, sys_argv=argv
    )
    flags.DEFINE_integer("devices", 8, "Devices of the target (without --target).", flag_values=fv)
    flags.DEFINE_float("device_memory_gb", 80.0, "Memory of one device, GB.", flag_values=fv)
    flags.DEFINE_string("target", "", "A TPU topology, e.g. tpu:v5e:4x4.", flag_values=fv)
    flags.DEFINE_string("json", "", "Write the rows to this JSON file.", flag_values=fv)
    flags.DEFINE_float(
        "headroom", DEFAULT_HEADROOM, "Fraction of memory kept free.", flag_values=fv
    )
    flags.DEFINE_list("programs", None, "Only these programs (default: all).", flag_values=fv)
    try:
        fv(argv)
    except flags.Error as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from essa_jax import distributed

    distributed.skip_absent_tpu()
    if holder.value is None:
        print("error: --config is required", file=sys.stderr)
        return 2
    try:
        target = make_target(fv.target or None, fv.devices, fv.device_memory_gb)
        name = os.path.splitext(os.path.basename(fv["config"].config_filename or "config"))[0]
        mc, source = plan_model_config(holder.value)
        print(f"plan: {name} ({holder.value.method}) on {target.name}; model {source}")
        print(format_header())
        plans = plan_config(
            holder.value,
            target,
            name=name,
            headroom=fv.headroom,
            programs=fv.programs,
            log=lambda s: print(s, flush=True),
        )
    except PlanError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if fv.json:
        os.makedirs(os.path.dirname(os.path.abspath(fv.json)), exist_ok=True)
        with open(fv.json, "w") as f:
            json.dump([p.row() for p in plans], f, indent=1)
    failed = [p for p in plans if not p.fits]
    for p in failed:
        print(f"error: {failure_message(p)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
