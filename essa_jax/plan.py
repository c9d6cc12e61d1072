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

Each row also gives the program's estimated seconds per call on the target's hardware (`--chip`,
a GPU of `essa_jax.scaling.costmodel.HARDWARE`; none for TPU topologies), and a last line the
estimated seconds per SFT step, ESSA generation and GRPO step: the cost model's rooflines of the
compiled programs' bytes and the model's FLOPs (`essa_jax.plan_report`), lower bounds.

The model's shape comes from `model.path`'s config.json (or GGUF header) when that exists, else from
`model.name` (`essa_jax.models.shapes`). A program fits when its per-device bytes leave `--headroom`
(default 10%) of the device's memory free (runtime, fragmentation, collective buffers). The command
exits 1 when one does not, naming the program and the settings that would make it fit.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from essa_jax.plan_report import (
    estimate_seconds,
    failure_message,
    format_header,
    format_legend,
    format_row,
    format_steps,
)
from essa_jax.train.programs import Program, ProgramInputs, abstract, mesh_sizes, model_flops

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
# The hardware figures (`essa_jax.scaling.costmodel.HARDWARE`) of the time estimates on GPU targets.
DEFAULT_CHIP = "H100-SXM"


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
    # The run's own devices (`host_target`): programs are built and compiled as this process's run
    # builds them (its dtype, its chunk choice, its compiler options and decode path), not as an
    # accelerator's stand-in.
    own: bool = False

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
    if device_memory_gb is None or not math.isfinite(device_memory_gb) or device_memory_gb <= 0:
        # nan / inf would reach int() as a traceback, a negative size a budget below zero.
        raise PlanError(
            f"--device_memory_gb {device_memory_gb}: expected the memory of one device in GB, a "
            "finite number > 0 (e.g. 80 for an H100)"
        )
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


def host_memory_bytes() -> int | None:
    """Memory this host can give a process: MemTotal of /proc/meminfo, capped by the cgroup's
    limit (a container's `memory.max` / `memory.limit_in_bytes`); None where neither is readable.
    The total, not what is free now: the check refuses a run that cannot fit, not one that might
    not fit beside today's other processes."""
    limits = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    limits.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                raw = f.read().strip()
        except OSError:
            continue
        if raw.isdigit() and int(raw) < 1 << 60:  # "max" / a huge number: no limit
            limits.append(int(raw))
    return min(limits) if limits else None


def host_target() -> Target:
    """The `Target` of this process's own run: its devices (`jax.devices()`, as the run's mesh
    uses them) with the memory each can use: an accelerator's `memory_stats()` limit, or for CPU
    devices the host's memory (`host_memory_bytes`) shared by this process's CPU devices, which
    all allocate from it. Programs on it are built as the run builds them (`Target.own`).
    Raises PlanError when the memory is unknown."""
    import jax

    from essa_jax.memory import device_memory_bytes

    devs = tuple(jax.devices())
    platform = devs[0].platform
    if platform == "cpu":
        host = host_memory_bytes()
        if host is None:
            raise PlanError("the host's memory is unknown (no /proc/meminfo)")
        per_device = host // len(jax.local_devices())
        where = f"host memory {host / 1e9:.1f} GB"
        if len(jax.local_devices()) > 1:
            where += f" shared by {len(jax.local_devices())} CPU devices"
    else:
        per_device = device_memory_bytes(devs[0])
        if per_device is None:
            raise PlanError(f"the memory of {devs[0].device_kind} is unknown (no memory_stats)")
        where = f"{per_device / 1e9:.1f} GB per {devs[0].device_kind}"
    name = f"this machine ({len(devs)} {platform} device{'s' if len(devs) > 1 else ''}, {where})"
    return Target(name, devs, int(per_device), platform, own=True)


def check_run_fits(config, *, headroom: float = DEFAULT_HEADROOM) -> list[ProgramPlan]:
    """The memory plan of `config`'s run against this machine (`host_target`): every program the
    run compiles, compiled ahead of time as the run compiles it. Returns the plans when all fit;
    raises PlanError, one line naming the first program that does not fit, its bytes, the
    machine's and the settings that shrink it, otherwise. `python -m essa_jax.main` calls it
    after `validate_config` and before any weight is read, so a run that cannot fit (a population
    of 10^6, a model larger than the host) ends in a second, not in the kernel's OOM killer."""
    plans = plan_config(config, host_target(), headroom=headroom, chip=None)
    for p in plans:
        if not p.fits:
            raise PlanError(
                f"{failure_message(p)} (checked before any weight is read; --nomemory_check "
                "skips it)"
            )
    return plans


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
    # Seconds of one call on the plan's chip (`plan_report.estimate_seconds`); None = no estimate.
    est_seconds: float | None = None

    def row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


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


def _replicated(devices: Sequence[Any]) -> Any:
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.sharding.Mesh(np.asarray(devices, dtype=object), ("d",))
    return NamedSharding(mesh, PartitionSpec())


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


def _programs(config, mc, target: Target) -> list[Program]:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from essa_jax import lora as lora_lib
    from essa_jax.mesh import place_params
    from essa_jax.models import init_params
    from essa_jax.models.generate import generate_jit
    from essa_jax.train.methods import get_method
    from essa_jax.train.pipeline import model_dtype

    # A plan is for accelerators: virtual CPU devices stand in for GPUs ("auto" = bfloat16); on
    # the run's own devices, the run's dtype.
    platform = "gpu" if target.compiler == "cpu" else target.compiler
    dtype = model_dtype(config.model.dtype, None if target.own else platform)
    mesh = _dp_mesh(config, target)
    # Where the run keeps what every program shares: on one device without a mesh; replicated
    # over the mesh with the base weights split over its model axis (`mesh.place_params`).
    rep = _replicated(target.devices[:1]) if mesh is None else NamedSharding(mesh, PartitionSpec())
    params_shape = jax.eval_shape(lambda k: init_params(k, mc, dtype), jax.random.key(0))
    base = abstract(params_shape, rep)
    if mesh is not None:
        base = place_params(params_shape, mesh, mc)
    # What runs after SFT reads the base in `model.quantize` form (`train.pipeline.
    # quantized_base`): int8 / int4 kernels and their scales, not float ones.
    infer_shape, infer_base = params_shape, base
    if config.model.quantize != "none":
        from essa_jax.models import quantize_params

        mode, group = config.model.quantize, int(config.model.quant_group)
        infer_shape = jax.eval_shape(lambda p: quantize_params(p, mode, group), params_shape)
        infer_base = abstract(infer_shape, rep)
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
    programs: list[Program] = []

    # SFT: prompt + reference answer, at most max_prompt_tokens + max_new_tokens long.
    if config.sft.steps > 0:
        sft_trainable = lora_shape
        if config.train.params != "lora":  # full-parameter SFT: the weights' float32 masters
            from essa_jax.lora.adapter import master_weights
            from essa_jax.lora.full import full_policy

            subset = config.train.params
            sft_trainable = jax.eval_shape(
                lambda p: master_weights(full_policy(p, subset)[0]), params_shape
            )
        programs.append(_sft_program(config, mc, base, sft_trainable, rep, mesh, tp + new))

    # The method's loop: its own programs, built by its object from the run's abstract inputs.
    inputs = ProgramInputs(
        config=config,
        mc=mc,
        devices=tuple(target.devices),
        # The run's own programs choose their chunks as the run does (from the device's own
        # memory statistics: none on a CPU, so no chunking), not from the plan's budget.
        device_memory_bytes=None if target.own else target.device_memory_bytes,
        mesh=mesh,
        rep=rep,
        infer_base=infer_base,
        infer_shape=infer_shape,
        lora_shape=lora_shape,
        prompt_len=tp,
        new_tokens=new,
        eos=eos,
    )
    programs += get_method(config.method).programs(inputs)

    # Held-out evaluation: one batch of eval.batch_size prompts, greedy (pass@k sampling runs the
    # same shapes with sampling on). The run evaluates with its weights as placed: on one device
    # when mesh.model = 1, tensor-parallel over the model axis otherwise.
    bs = min(int(config.eval.batch_size), int(config.task.num_heldout))
    tensor_parallel = mesh is not None and int(config.mesh.model) > 1
    ev_rep = rep if tensor_parallel else _replicated(target.devices[:1])
    ev_params = infer_base if tensor_parallel else abstract(infer_shape, ev_rep)
    lora = abstract(lora_shape, ev_rep)

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
        Program(
            "heldout_eval",
            lower_eval,
            mesh_sizes(mesh) if tensor_parallel else {"devices": 1},
            {"eval.batch_size": bs},
            f"a smaller eval.batch_size (now {bs}), or a larger mesh.model",
            model_flops(mc, bs, tp, new),
        )
    )
    return programs


def _sft_program(config, mc, base, lora_shape, rep, mesh, seq_len) -> Program:
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
            abstract(lora_shape, rep),
            abstract(opt_shape, rep),
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
    return Program(
        "sft_step",
        lower,
        mesh_sizes(mesh),
        {"sft.batch_size": b, "sft.micro_batch_size": micro or per_device, "sequence": seq_len},
        "model.remat=True, a smaller sft.micro_batch_size (rows per device), or a larger "
        "mesh.model",
        model_flops(mc, per_device, seq_len, train=True, remat=_remat(config)),
    )


# -- compile and account ------------------------------------------------------------------------


def plan_config(
    config,
    target: Target,
    *,
    name: str = "",
    headroom: float = DEFAULT_HEADROOM,
    programs: Sequence[str] | None = None,
    log: Callable[[str], None] | None = None,
    chip: str | None = DEFAULT_CHIP,
) -> list[ProgramPlan]:
    """Compile every program of `config`'s run for `target`; one `ProgramPlan` per program.

    `programs` restricts the plan to these names; `chip` (a key of `costmodel.HARDWARE`, None =
    no estimate) the hardware figures of each program's `est_seconds`. Raises PlanError when the
    config is invalid for the target (e.g. a mesh that does not divide its devices).
    """
    from essa_jax.config import ConfigError
    from essa_jax.train.methods import validate_config
    from essa_jax.train.pipeline import check_data_parallel

    if not (isinstance(headroom, int | float) and 0.0 <= headroom < 1.0):
        # headroom >= 1 leaves a budget of zero or less: every program "does not fit".
        raise PlanError(
            f"--headroom {headroom}: expected the fraction of memory kept free, 0 <= h < 1 "
            f"(default {DEFAULT_HEADROOM})"
        )
    mc, _ = plan_model_config(config)
    try:
        validate_config(config, target.num_devices, model_config=mc)
        check_data_parallel(config, _dp_mesh(config, target))
    except ConfigError as e:
        raise PlanError(str(e)) from None
    if programs is not None:
        names = [p.name for p in _programs(config, mc, target)]
        unknown = [p for p in programs if p not in names]
        if unknown:
            # Else a typo plans nothing and the empty table "fits".
            raise PlanError(
                f"--programs {','.join(unknown)}: not a program of this {config.method!r} run; "
                f"its programs: {', '.join(names)}"
            )
    if target.own:
        # The run's own decode path and compiler options: what this process would compile.
        return _compile_all(config, mc, target, name, headroom, programs, log, chip)
    from essa_jax.models.generate import decode_layers

    # Decode as accelerators run it (the layer scan), also when XLA's CPU compiler stands in for a
    # GPU's or the process's backend is CPU while compiling for a TPU topology.
    with decode_layers("scan"):
        return _compile_all(config, mc, target, name, headroom, programs, log, chip)


def compiler_options(target: Target) -> dict[str, str]:
    """XLA options for compiling for `target`.

    XLA's CPU compiler has no bfloat16 matmul: it converts the operands to float32 (its
    float-normalization pass), and loop-invariant code motion then hoists the conversion of a
    whole stacked weight out of the layer loop, a float32 copy of the model (twice its bfloat16
    bytes) that a GPU or TPU, which multiply bfloat16 natively, never makes. When the CPU compiler
    stands in for a GPU's, that hoisting is off, so each conversion stays a temporary of one layer
    (or of the head, per decode step): still an overestimate, by about that much. The program is
    compiled, never run, so only its buffers matter.

    XLA's TPU compiler (libtpu of jax 0.10.2) fails a RET_CHECK in its
    while-loop-all-reduce-code-motion pass (`user->opcode() == kAdd`) on the full-parameter update,
    whose layer loop reduce-scatters each layer's gradient in float32 and rounds it to the weights'
    dtype (`mesh.data_gather`'s backward): the pass is off for TPU targets, which only keeps those
    reduce-scatters inside the loop, where the program writes them. A TPU run needs the same:
    XLA_FLAGS=--xla_disable_hlo_passes=while-loop-all-reduce-code-motion (docs/ARCHITECTURE.md,
    "Full-parameter training").
    """
    if target.own:
        return {}  # the run's own programs: compiled as the run compiles them
    if target.compiler == "cpu":
        return {"xla_disable_hlo_passes": "while-loop-invariant-code-motion"}
    return {"xla_disable_hlo_passes": "while-loop-all-reduce-code-motion"}


def compiled_programs(
    config, mc, target: Target, programs: Sequence[str] | None = None
) -> Iterator[tuple[Program, Any, float]]:
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


def _compile_all(config, mc, target, name, headroom, programs, log, chip) -> list[ProgramPlan]:
    from essa_jax.scaling.costmodel import HARDWARE

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
            if chip is not None:
                plan.est_seconds = estimate_seconds(plan, config, mc, HARDWARE[chip])
        if log is not None:
            log(format_row(plan))
        out.append(plan)
    return out


def _row(
    prog: Program,
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
    from essa_jax.scaling.costmodel import HARDWARE

    flags.DEFINE_enum(
        "chip",
        DEFAULT_CHIP,
        list(HARDWARE),
        "Hardware figures of the time estimates (essa_jax.scaling.costmodel.HARDWARE); GPU "
        "targets only.",
        flag_values=fv,
    )
    if any(a in ("--help", "-h", "-?", "--helpshort", "--helpfull") for a in argv[1:]):
        print(f"{__doc__}\nFlags:\n{fv.get_help(prefix='  ', include_special_flags=False)}")
        return 0
    from essa_jax.main import parse_config_flags

    # A missing or unreadable config file, one whose get_config() fails or returns no ConfigDict,
    # an unknown field: one line, as `python -m essa_jax.main` says it.
    rest = parse_config_flags(argv, fv)
    if isinstance(rest, str):
        print(f"error: {rest}", file=sys.stderr)
        return 2
    if len(rest) > 1:
        print(f"error: unexpected arguments {rest[1:]} (see --help)", file=sys.stderr)
        return 2
    from essa_jax import distributed

    distributed.skip_absent_tpu()
    if holder.value is None:
        print("error: --config is required (experiments/configs/*.py)", file=sys.stderr)
        return 2
    if not (math.isfinite(fv.headroom) and 0.0 <= fv.headroom < 1.0):
        print(
            f"error: --headroom {fv.headroom}: expected the fraction of each device's memory kept "
            f"free, 0 <= h < 1 (default {DEFAULT_HEADROOM})",
            file=sys.stderr,
        )
        return 2
    try:
        target = make_target(fv.target or None, fv.devices, fv.device_memory_gb)
        name = os.path.splitext(os.path.basename(fv["config"].config_filename or "config"))[0]
        mc, source = plan_model_config(holder.value)
        chip = None if target.compiler == "tpu" else fv.chip
        print(f"plan: {name} ({holder.value.method}) on {target.name}; model {source}")
        print(format_legend(None if chip is None else HARDWARE[chip]))
        print(format_header())
        plans = plan_config(
            holder.value,
            target,
            name=name,
            headroom=fv.headroom,
            programs=fv.programs,
            log=lambda s: print(s, flush=True),
            chip=chip,
        )
    except PlanError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    steps = format_steps(plans, holder.value)
    if steps:
        print(steps)
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
