"""The command line and config validation: bad configs fail before any model load or compile,
with a message naming the field, the value and what would be valid."""

import glob
import os
import subprocess
import sys

import pytest
from absl import flags

from essa_jax.config import ConfigError, base_config, load_config_file
from essa_jax.train import validate_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "experiments", "configs")


def tiny(**over):
    c = base_config()
    c.model.path = "random:tiny"
    for k, v in over.items():
        node = c
        *parents, leaf = k.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = v
    return c


def _error(config, num_devices=1) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        validate_config(config, num_devices=num_devices)
    return e.value


def test_valid_tiny_config_passes():
    validate_config(tiny(), num_devices=8)


def test_mesh_data_and_model_divide_the_devices_and_heads():
    # The population axis takes the remaining devices and pads: any population size is valid.
    validate_config(tiny(**{"essa.population_size": 6}), num_devices=8)
    validate_config(tiny(**{"mesh.data": 4, "essa.population_size": 6}), num_devices=8)
    e = _error(tiny(**{"mesh.data": 3}), num_devices=8)
    assert e.field == "mesh.data" and "3" in str(e) and "[1, 2, 4, 8]" in str(e)
    assert _error(tiny(**{"mesh.data": 0}), num_devices=8).field == "mesh.data"
    validate_config(tiny(**{"mesh.model": 2}), num_devices=8)  # tensor parallelism
    e = _error(tiny(**{"mesh.model": 4}), num_devices=8)  # random:tiny has 2 KV heads
    assert e.field == "mesh.model" and "valid values are [1, 2]" in str(e)
    assert "population_devices" not in tiny().essa


def test_prompt_sampling_and_openai_es_learning_rate():
    for mode in ("shared", "per_candidate"):
        validate_config(tiny(**{"essa.prompt_sampling": mode}))
    assert tiny().essa.prompt_sampling == "shared"
    e = _error(tiny(**{"essa.prompt_sampling": "per_member"}))
    assert e.field == "essa.prompt_sampling" and "'per_candidate'" in str(e)
    for name in ("essa_qwen2p5_7b_gsm8k.py", "essa_qwen2p5_32b_prm800k.py"):
        assert load_config_file(os.path.join(CONFIGS, name)).essa.prompt_sampling == "per_candidate"
    validate_config(tiny(**{"essa.strategy": "openai_es", "essa.learning_rate": 0.05}))
    e = _error(tiny(**{"essa.strategy": "openai_es", "essa.learning_rate": 0.0}))
    assert e.field == "essa.learning_rate" and "> 0" in str(e)


def test_config_module_imports_no_training_loop():
    # essa_jax.config sits below the loops: checking its fields must not import essa_jax.train
    # (the method's own section is the method object's, essa_jax.train.methods).
    code = (
        "import sys; from essa_jax.config import base_config, check_fields\n"
        "c = base_config(); c.model.path = 'random:tiny'; check_fields(c, num_devices=1)\n"
        "bad = sorted(m for m in sys.modules if m.startswith(('essa_jax.train', "
        "'essa_jax.population')))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_missing_data_path():
    e = _error(tiny(**{"task.name": "gsm8k"}))
    assert e.field == "task.path" and "--config.task.path" in str(e)
    e = _error(tiny(**{"task.name": "gsm8k", "task.path": "/nonexistent/gsm8k.jsonl"}))
    assert e.field == "task.path" and "/nonexistent/gsm8k.jsonl" in str(e)


def test_rank_larger_than_model_dims():
    # random:tiny: hidden 32, k/v out = 2 kv heads x head_dim 8 = 16.
    e = _error(tiny(**{"lora.rank": 17}))
    assert e.field == "lora.rank" and "17" in str(e) and "1..16" in str(e)
    validate_config(tiny(**{"lora.rank": 16}))
    validate_config(tiny(**{"lora.rank": 17, "lora.targets": ("q", "o")}))


def test_group_size_vs_batch_and_focal():
    e = _error(tiny(**{"method": "grpo", "grpo.batch_size": 30, "grpo.group_size": 8}))
    assert e.field == "grpo.batch_size" and "multiples of grpo.group_size=8" in str(e)
    e = _error(tiny(**{"method": "grpo", "grpo.group_size": 1, "grpo.batch_size": 4}))
    assert e.field == "grpo.group_size"
    e = _error(tiny(**{"method": "fgrpo", "grpo.focal_gamma": 0.0}))
    assert e.field == "grpo.focal_gamma"
    e = _error(tiny(**{"method": "grpo", "grpo.focal_gamma": 0.5}))
    assert "fgrpo" in str(e)


def test_smollm2_methods_share_the_sft_start_and_the_task():
    # compare_smollm2.sh compares methods from one SFT adapter on one held-out set.
    essa = load_config_file(os.path.join(CONFIGS, "essa_smollm2_arith.py"))
    for name in ("grpo", "fgrpo", "svdgrpo"):
        other = load_config_file(os.path.join(CONFIGS, f"{name}_smollm2_arith.py"))
        assert other.method == name
        for block in ("model", "task", "lora", "sft"):
            assert other[block].to_dict() == essa[block].to_dict(), (name, block)
        assert other.seed == essa.seed


def test_mirrored_needs_cma_es_and_an_even_population():
    e = _error(tiny(**{"essa.mirrored": True, "essa.strategy": "sep_cma_es"}))
    assert e.field == "essa.mirrored" and "cma_es" in str(e)
    e = _error(tiny(**{"essa.mirrored": True, "essa.population_size": 5}))
    assert e.field == "essa.population_size" and "even" in str(e)
    validate_config(tiny(**{"essa.mirrored": True, "essa.population_size": 6}))


@pytest.mark.parametrize(
    "field,value",
    [
        ("method", "ppo"),
        ("model.dtype", "float16"),
        ("model.path", "random:huge"),
        ("lora.targets", ("q", "x")),
        ("essa.alpha", 0.0),
        ("eval.pass_k", (1, 32)),
        ("task.prompt_format", "cot"),
        ("eval.samples_to_log", -1),
    ],
)
def test_bad_values_name_the_field(field, value):
    over = {field: value}
    if field == "eval.pass_k":
        over["eval.pass_k_samples"] = 16
    e = _error(tiny(**over))
    assert e.field == field and repr(value) in str(e) and "valid" in str(e)


def test_shipped_configs(monkeypatch):
    import essa_jax.config as config_mod

    # Reading the GGUF header of the real model costs seconds; its dims are checked in
    # test_default_config_against_the_real_model_header.
    real_peek = config_mod.peek_model_config
    monkeypatch.setattr(
        config_mod,
        "peek_model_config",
        lambda path: None if "smollm2" in path else real_peek(path),
    )
    paths = sorted(glob.glob(os.path.join(CONFIGS, "*.py")))
    names = {os.path.basename(p) for p in paths}
    assert {
        "essa_smollm2_arith.py",
        "grpo_smollm2_arith.py",
        "fgrpo_smollm2_arith.py",
        "svdgrpo_smollm2_arith.py",
        "essa_qwen2p5_7b_gsm8k.py",
        "essa_qwen2p5_32b_prm800k.py",
        "fgrpo_qwen2p5_7b_deepscaler.py",
        "grpo_qwen2p5_7b_gsm8k.py",
        "grpo_qwen2p5_32b_prm800k.py",
    } <= names
    for p in paths:
        c = load_config_file(p)
        if "smollm2" in p:
            validate_config(c, num_devices=1)
        else:  # paper settings: placeholders until the user points them at local files
            e = _error(c)
            assert e.field == "model.path" and "set --config.model.path" in str(e)


@pytest.mark.slow
def test_default_config_against_the_real_model_header(smollm2_gguf_path):
    c = load_config_file(os.path.join(CONFIGS, "essa_smollm2_arith.py"))
    validate_config(c, num_devices=1)
    c.lora.rank = 193  # SmolLM2-135M: k / v project 576 -> 3 kv heads x 64 = 192
    e = _error(c)
    assert e.field == "lora.rank" and "1..192" in str(e)


@pytest.fixture
def cli(monkeypatch):
    """Run essa_jax.main.main in-process; loading a model would fail the test."""
    from essa_jax import main as main_mod
    from essa_jax.train import pipeline

    def no_load(*a, **k):
        raise AssertionError("the model was loaded although the config is invalid")

    monkeypatch.setattr(pipeline, "load_model", no_load)
    import essa_jax.config as config_mod

    monkeypatch.setattr(config_mod, "peek_model_config", lambda path: None)  # no GGUF header read

    def call(*args):
        argv = ["essa_jax.main", *args]
        fv = flags.FlagValues()
        holders = main_mod.define_flags(fv, sys_argv=argv)
        fv(argv)
        return main_mod.run_from_flags(holders)

    return call


def test_cli_invalid_value_exits_2_before_loading(cli, tmp_path, capsys):
    cfg = os.path.join(CONFIGS, "grpo_smollm2_arith.py")
    rc = cli(f"--config={cfg}", f"--workdir={tmp_path}", "--config.grpo.batch_size=30")
    assert rc == 2
    err = capsys.readouterr().err
    assert "config.grpo.batch_size = 30" in err and "multiples of grpo.group_size=8" in err


def test_cli_placeholder_model_path(cli, tmp_path, capsys):
    cfg = os.path.join(CONFIGS, "essa_qwen2p5_7b_gsm8k.py")
    assert cli(f"--config={cfg}", f"--workdir={tmp_path}") == 2
    assert "set --config.model.path" in capsys.readouterr().err


def test_main_joins_the_run_before_anything_else(monkeypatch):
    """jax.distributed must be initialised before validate_config creates the JAX backend."""
    from essa_jax import main as main_mod

    calls = []
    monkeypatch.setattr(main_mod.distributed, "initialize_from_flags", lambda: calls.append("init"))
    monkeypatch.setattr(main_mod.distributed, "shutdown", lambda: calls.append("shutdown"))
    monkeypatch.setattr(main_mod, "run_from_flags", lambda holders: calls.append("run") or 0)
    assert main_mod.main(["essa_jax.main"]) == 0
    assert calls == ["init", "run", "shutdown"]
    # The multi-process flags exist on the CLI, --coordinator as an alias.
    for name in ("coordinator_address", "coordinator", "num_processes", "process_id"):
        assert name in flags.FLAGS, name


def test_dry_run_validates_as_the_run_does_and_reads_no_weight(cli, tmp_path, monkeypatch, capsys):
    """--dry_run: the run's own validate_config, then exit; no workdir needed, none written, no
    model loaded (the `cli` fixture fails the test on a load), the training never entered."""
    from essa_jax import train

    monkeypatch.setattr(
        train, "train_and_evaluate", lambda *a, **k: pytest.fail("a dry run started the run")
    )
    cfg = os.path.join(CONFIGS, "grpo_smollm2_arith.py")
    monkeypatch.chdir(tmp_path)
    assert cli(f"--config={cfg}", "--dry_run") == 0
    assert "config OK" in capsys.readouterr().out
    assert cli(f"--config={cfg}", "--dry_run", "--config.grpo.batch_size=30") == 2
    assert "config.grpo.batch_size = 30" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []
    # Without --dry_run the same command still needs --workdir.
    assert cli(f"--config={cfg}") == 2
    assert "--workdir" in capsys.readouterr().err
