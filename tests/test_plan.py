"""The ahead-of-time memory plan (essa_jax.plan) on tiny configs: every program, real byte counts,
a clear failure when the budget is too small, and XLA's TPU compiler through libtpu."""

import dataclasses
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from essa_jax import plan as plan_lib
from essa_jax.config import UNSET, base_config
from essa_jax.models import init_params, tiny_model_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_ESSA = os.path.join(ROOT, "tests", "distributed", "tiny_essa_config.py")


def tiny_config(method: str = "essa"):
    c = base_config()
    c.method = method
    c.model.path = "random:tiny"
    c.task.num_train = 64
    c.task.num_heldout = 8
    c.task.max_prompt_tokens = 24
    c.lora.rank = 2
    c.lora.alpha = 4.0
    c.sft.steps = 2
    c.sft.batch_size = 4
    c.essa.population_size = 6  # not a multiple of the 4-device pop axis: padded
    c.essa.prompts_per_candidate = 3
    c.generation.max_new_tokens = 4
    c.eval.batch_size = 8
    c.grpo.batch_size = 8
    c.grpo.group_size = 4
    c.grpo.focal_gamma = 0.5 if method == "fgrpo" else 0.0
    return c


def param_bytes(config, dtype=np.float32) -> int:
    shapes = jax.eval_shape(lambda k: init_params(k, config, dtype), jax.random.key(0))
    return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(shapes))


def test_essa_plan_reports_every_program_with_real_bytes():
    target = plan_lib.make_target(None, 4, 1.0)
    plans = plan_lib.plan_config(tiny_config("essa"), target, name="tiny")
    assert [p.program for p in plans] == ["sft_step", "essa_population", "heldout_eval"]
    by = {p.program: p for p in plans}
    # model.dtype "auto": a plan is for accelerators, so the base is bfloat16.
    weights = param_bytes(tiny_model_config("tiny"), jnp.bfloat16)
    for p in plans:
        assert p.fits and p.devices == 4 and p.device_memory_bytes == 1_000_000_000
        assert (
            p.per_device_bytes == p.argument_bytes + p.output_bytes + p.temp_bytes - p.alias_bytes
        )
        # Every program takes the whole base model as an argument on each device.
        assert p.argument_bytes >= weights
        assert p.flops > 0
    pop = by["essa_population"]
    assert pop.mesh == {"pop": 4, "data": 1, "model": 1}
    assert pop.chunks["rows_per_device"] == 2 * 3  # ceil(6 / 4) members x 3 prompts
    # The held-out program's arguments: weights + LoRA (float32) + tokens, nothing else large.
    ev = by["heldout_eval"]
    assert ev.argument_bytes < weights * 1.5


def test_model_dtype_auto_is_bfloat16_on_accelerators_and_float32_on_cpu():
    from essa_jax.train.pipeline import model_dtype

    assert model_dtype("auto", "gpu") == jnp.bfloat16 and model_dtype("auto", "tpu") == jnp.bfloat16
    assert model_dtype("auto", "cpu") == jnp.float32
    assert model_dtype("float32", "gpu") == jnp.float32
    assert model_dtype("auto") == jnp.float32  # this machine's default backend is the CPU
    # The plan compiles the bfloat16 base for "auto" and the float32 one when asked.
    target = plan_lib.make_target(None, 2, 1.0)
    c = tiny_config("essa")
    auto = {p.program: p for p in plan_lib.plan_config(c, target)}["heldout_eval"]
    c.model.dtype = "float32"
    f32 = {p.program: p for p in plan_lib.plan_config(c, target)}["heldout_eval"]
    weights = param_bytes(tiny_model_config("tiny"))
    assert f32.argument_bytes - auto.argument_bytes >= 0.45 * weights


def test_grpo_plan_has_rollout_and_update():
    target = plan_lib.make_target(None, 2, 1.0)
    plans = plan_lib.plan_config(tiny_config("fgrpo"), target)
    assert [p.program for p in plans] == ["sft_step", "grpo_rollout", "grpo_update", "heldout_eval"]
    c = tiny_config("fgrpo")
    c.grpo.beta = 0.04  # a KL term needs the reference log-probs: one more program
    names = [p.program for p in plan_lib.plan_config(c, target)]
    assert names == ["sft_step", "grpo_rollout", "grpo_score", "grpo_update", "heldout_eval"]


def test_model_shape_from_name_when_the_checkpoint_is_absent():
    c = tiny_config()
    c.model.path = UNSET
    with pytest.raises(plan_lib.PlanError, match="model.name"):
        plan_lib.plan_model_config(c)
    c.model.name = "Qwen2.5-7B-Instruct"
    mc, source = plan_lib.plan_model_config(c)
    assert (mc.hidden_size, mc.num_layers, mc.num_kv_heads, mc.vocab_size) == (3584, 28, 4, 152064)
    assert abs(mc.num_params() - 7.62e9) < 0.01e9 and source == "model.name=Qwen2.5-7B-Instruct"
    c.model.name = "Qwen9-1T"
    with pytest.raises(plan_lib.PlanError, match="known"):
        plan_lib.plan_model_config(c)


def test_invalid_mesh_for_the_target_is_a_plan_error():
    c = tiny_config()
    c.mesh.data = 3
    with pytest.raises(plan_lib.PlanError, match="mesh.data"):
        plan_lib.plan_config(c, plan_lib.make_target(None, 4, 1.0))


def test_too_small_budget_fails_with_one_line_naming_program_and_fix():
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    cmd = [sys.executable, "-m", "essa_jax.plan", "--config", TINY_ESSA, "--devices", "4"]
    ok = subprocess.run(
        [*cmd, "--device_memory_gb", "1", "--programs", "essa_population"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stderr
    assert "essa_population" in ok.stdout and "pop=4,data=1,model=1" in ok.stdout
    # Units on every column, the estimated time per call and per ESSA generation.
    header = next(ln for ln in ok.stdout.splitlines() if ln.startswith("program"))
    for column in ("args GB", "temp GB", "total GB", "TFLOP", "est s", "chunks (rows)"):
        assert column in header, header
    row = next(ln for ln in ok.stdout.splitlines() if ln.startswith("essa_population"))
    # program, mesh, args, temp, out, total, of, fits, TFLOP, est s, chunks
    est = float(row.split()[9])
    steps = next(ln for ln in ok.stdout.splitlines() if ln.startswith("estimated per step:"))
    assert est > 0 and f"ESSA generation {est:.3g} s" in steps, (row, steps)
    assert "on H100-SXM" in ok.stdout
    bad = subprocess.run(
        [*cmd, "--device_memory_gb", "0.00001", "--programs", "essa_population"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1
    errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in bad.stderr
    assert "essa_population does not fit" in errors[0] and "essa.rows_per_chunk" in errors[0]


def test_help_exits_0_with_usage_and_flags():
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, "-m", "essa_jax.plan", "--help"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert "python -m essa_jax.plan --config" in out.stdout
    for flag in ("--config", "--devices", "--device_memory_gb", "--target", "--chip", "--json"):
        assert flag in out.stdout, flag


def test_estimated_seconds_are_rooflines_of_the_compiled_programs():
    """Each program's `est_seconds` lies between the cost model's roofline bounds, computed here
    from the plan's own bytes and FLOPs: a generation reads the device's weights (its argument
    bytes) at every one of its decode steps, and cannot beat its FLOPs at the chip's peak; and a
    GRPO step is its rollout + scoring + epochs x minibatches updates."""
    from essa_jax import plan_report
    from essa_jax.scaling.costmodel import HARDWARE

    chip = HARDWARE[plan_lib.DEFAULT_CHIP]
    c = tiny_config("grpo")
    c.grpo.epochs, c.grpo.num_minibatches, c.grpo.beta = 2, 2, 0.04  # old + reference log-probs
    plans = plan_lib.plan_config(c, plan_lib.make_target(None, 2, 1.0))
    by = {p.program: p for p in plans}
    new = c.generation.max_new_tokens
    for name in ("grpo_rollout", "heldout_eval"):
        p = by[name]
        reads = new * p.argument_bytes / chip.hbm_bandwidth  # the decode steps' weight reads
        compute = p.model_flops / chip.peak_flops
        assert max(reads, compute) <= p.est_seconds, name
        # + the prefill's read and the KV cache (a few rows of a tiny model: < 50% more)
        assert p.est_seconds <= 1.5 * ((new + 1) * p.argument_bytes / chip.hbm_bandwidth + compute)
    for name in ("sft_step", "grpo_score", "grpo_update"):
        p = by[name]
        assert p.est_seconds >= p.model_flops / chip.peak_flops > 0, name
    steps = plan_report.step_seconds(plans, c)
    est = {p.program: p.est_seconds for p in plans}
    grpo = est["grpo_rollout"] + est["grpo_score"] + 4 * est["grpo_update"]
    assert steps == {"SFT step": est["sft_step"], "GRPO step": grpo}
    # No hardware figures, no estimate.
    assert all(p.est_seconds is None for p in plan_lib.plan_config(c, plan_lib.make_target(
        None, 2, 1.0), programs=["grpo_rollout"], chip=None))  # fmt: skip


def test_bad_target_exits_2_with_one_line():
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, "-m", "essa_jax.plan", "--config", TINY_ESSA, "--target", "tpu:v9z:2x2"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "unknown TPU type 'v9z'" in out.stderr


def test_tpu_topology_compiles_with_the_tpu_compiler():
    pytest.importorskip("libtpu")
    target = plan_lib.make_target("tpu:v5e:2x2", 0, None)
    assert target.compiler == "tpu" and target.num_devices == 4
    assert target.device_memory_bytes == 16_000_000_000
    assert "v5 lite" in target.devices[0].device_kind.lower()
    plans = plan_lib.plan_config(tiny_config("essa"), target, name="tiny")
    assert [p.program for p in plans] == ["sft_step", "essa_population", "heldout_eval"]
    weights = param_bytes(tiny_model_config("tiny"))
    assert all(p.fits and p.argument_bytes >= weights for p in plans)
    # The same program against a budget too small for it.
    small = dataclasses.replace(target, device_memory_bytes=1000)
    (pop,) = plan_lib.plan_config(tiny_config("essa"), small, programs=["essa_population"])
    assert not pop.fits and "does not fit" in plan_lib.failure_message(pop)


def test_the_programs_of_a_method_come_from_its_object():
    """The plan asks the method: a user's method with a program of its own is planned (compiled,
    accounted) between SFT and evaluation; no list of method names in the plan decides that."""
    from essa_jax.train.methods import _METHODS, Method, register_method
    from essa_jax.train.programs import Program

    lowered = []

    @dataclasses.dataclass(frozen=True)
    class Doubling(Method):
        def programs(self, inputs):
            # A program over the run's abstract inputs: the inference base's embedding, doubled.
            emb = inputs.infer_base["embed"]

            def lower():
                lowered.append(emb.shape)
                return jax.jit(lambda e: 2 * e).lower(emb)

            return [Program("doubling", lower, {"devices": 1}, {}, "nothing shrinks it")]

    register_method(Doubling("doubling_test"))
    try:
        target = plan_lib.make_target(None, 1, 1.0)
        plans = plan_lib.plan_config(tiny_config("doubling_test"), target)
    finally:
        _METHODS.pop("doubling_test")
    assert [p.program for p in plans] == ["sft_step", "doubling", "heldout_eval"]
    mc = tiny_model_config("tiny")
    assert lowered == [(mc.vocab_size, mc.hidden_size)]
    doubling = {p.program: p for p in plans}["doubling"]
    # bfloat16 embedding in, the same out: XLA's own accounting of the method's program.
    emb_bytes = mc.vocab_size * mc.hidden_size * 2
    assert doubling.argument_bytes == emb_bytes and doubling.output_bytes == emb_bytes


def test_full_parameter_grpo_plan_shards_weights_and_optimizer_state_over_data():
    """train.params = "full": the plan compiles full-parameter SFT and the ZeRO-sharded GRPO
    programs; the update's per-device arguments (masters + AdamW state + batch) are about 1 / data
    of the one-device update's."""
    c = tiny_config("grpo")
    c.train.params = "full"
    weights = param_bytes(tiny_model_config("tiny"))  # float32 bytes of every weight
    upd = {}
    for n in (1, 4):
        plans = {p.program: p for p in plan_lib.plan_config(c, plan_lib.make_target(None, n, 1.0))}
        assert list(plans) == ["sft_step", "grpo_rollout", "grpo_update", "heldout_eval"]
        upd[n] = plans["grpo_update"]
    assert upd[1].argument_bytes >= 3 * weights  # masters, m and v, whole on one device
    assert upd[4].argument_bytes <= upd[1].argument_bytes / 4 + 1024


@pytest.mark.parametrize(
    "args, expected",
    [
        # A typo used to plan nothing and exit 0 with an empty table ("fits").
        (
            ["--programs", "essa_pop"],
            ("--programs essa_pop: not a program of this 'essa' run", "sft_step, essa_population"),
        ),
        (["--headroom", "1.5"], ("--headroom 1.5", "0 <= h < 1")),
        (["--headroom", "-0.1"], ("--headroom -0.1", "0 <= h < 1")),
        (["--device_memory_gb", "nan"], ("--device_memory_gb nan", "a finite number > 0")),
        (["--device_memory_gb", "inf"], ("--device_memory_gb inf", "a finite number > 0")),
        (["--device_memory_gb", "-1"], ("--device_memory_gb -1.0", "a finite number > 0")),
        (["--config", "/nonexistent/config.py"], ("/nonexistent/config.py: no such file",)),
    ],
)
def test_bad_plan_arguments_exit_2_with_one_line(args, expected, tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    config = [] if "--config" in args else ["--config", TINY_ESSA]
    out = subprocess.run(
        [sys.executable, "-m", "essa_jax.plan", *config, "--devices", "1", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2, (out.returncode, out.stderr[-3000:])
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr[-3000:]
    for e in expected:
        assert e in lines[0], (e, lines[0])


def test_plan_config_refuses_a_headroom_outside_0_1():
    with pytest.raises(plan_lib.PlanError, match="0 <= h < 1"):
        plan_lib.plan_config(tiny_config(), plan_lib.make_target(None, 1, 1.0), headroom=1.0)


def test_host_memory_is_the_smaller_of_the_host_and_its_cgroup():
    host = plan_lib.host_memory_bytes()
    assert host is not None and host > 0
    with open("/proc/meminfo") as f:
        total = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("MemTotal:"))
    assert host <= total
