"""Faults of the command lines that used to be silently wrong or a traceback (issue #44, part B).

Each case runs the command as a user does (a subprocess) and checks the exit status and the whole
of stderr: exactly one line naming what is wrong and what is valid, no traceback, and that nothing
was written where it would have been. Cases: a config file whose get_config() returns a dict or
None, raises, is missing or has a syntax error; a run that cannot fit this machine's memory
(refused by --dry_run and by a real run before any weight is read); partial multi-process flags;
`python -m essa_jax.plot` on a missing, empty or truncated folder; and a run's adapter/ older than
its latest checkpoint (a finished run resumed and stopped), refused as `sft.init_from`.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest
from cli_runs import TINY_SFT, cli_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_ESSA = os.path.join(ROOT, "tests", "distributed", "tiny_essa_config.py")
DEFAULT = os.path.join(ROOT, "experiments", "configs", "essa_smollm2_arith.py")


def run(module: str, *args: str, cwd, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {**cli_env(), **(env_extra or {})}  # one device: nothing here is about sharding
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def one_error_line(proc: subprocess.CompletedProcess, *expected: str) -> str:
    """Exit 2, no traceback, exactly one stderr line, "error: ...", holding every `expected`."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("error: "), lines[0]
    for e in expected:
        assert e in lines[0], (e, lines[0])
    return lines[0]


# -- config files -------------------------------------------------------------------------------

BAD_CONFIGS = {
    "returns_dict.py": (
        "def get_config():\n    return {'method': 'essa'}\n",
        ("get_config() returned a dict", "must return an ml_collections.ConfigDict"),
    ),
    "returns_none.py": (
        "def get_config():\n    c = 1\n",
        ("get_config() returned None", "must return an ml_collections.ConfigDict"),
    ),
    "raises.py": (
        "def get_config():\n    raise KeyError('model_path')\n",
        ("line 2 raised KeyError: 'model_path'", "must return an ml_collections.ConfigDict"),
    ),
    "no_get_config.py": (
        "CONFIG = {}\n",
        ("defines no get_config()", "must return an ml_collections.ConfigDict"),
    ),
    "syntax.py": ("def get_config(:\n", ("line 1", "must return an ml_collections.ConfigDict")),
}


@pytest.mark.parametrize("module", ["essa_jax.main", "essa_jax.plan"])
@pytest.mark.parametrize("name", sorted(BAD_CONFIGS))
def test_config_file_whose_get_config_is_wrong_is_one_line(module, name, tmp_path):
    source, expected = BAD_CONFIGS[name]
    path = tmp_path / name
    path.write_text(source)
    args = ["--dry_run"] if module == "essa_jax.main" else ["--devices", "1"]
    proc = run(module, f"--config={path}", *args, cwd=tmp_path)
    one_error_line(proc, f"--config {path}", *expected)


@pytest.mark.parametrize("module", ["essa_jax.main", "essa_jax.plan"])
def test_missing_or_folder_config_is_one_line(module, tmp_path):
    for path, expected in ((tmp_path / "nope.py", "no such file"), (tmp_path, "a folder")):
        proc = run(module, "--config", str(path), cwd=tmp_path)
        one_error_line(proc, f"--config {path}: {expected}", "experiments/configs")


# -- the run's memory plan on this machine --------------------------------------------------------


def test_dry_run_checks_the_memory_plan_of_the_runs_programs(tmp_path):
    ok = run("essa_jax.main", f"--config={TINY_ESSA}", "--dry_run", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert "memory OK: 3 programs fit this machine" in ok.stdout, ok.stdout
    assert "host memory" in ok.stdout and "essa_population" in ok.stdout
    big = run(
        "essa_jax.main",
        f"--config={TINY_ESSA}",
        "--dry_run",
        "--config.essa.population_size=1000000",
        cwd=tmp_path,
    )
    one_error_line(
        big,
        "essa_population does not fit",
        "GB per device >",
        "on this machine (1 cpu device, host memory",
        "essa.rows_per_chunk",
    )
    assert os.listdir(tmp_path) == []  # a dry run writes nothing


def test_dry_run_checks_the_tasks_prompts_as_the_run_does(tmp_path):
    """Prompts that cannot run (every one longer than task.max_prompt_tokens) are refused by
    --dry_run with the run's own line, not accepted and then refused by the run."""
    ok = run("essa_jax.main", f"--config={TINY_ESSA}", "--dry_run", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert "train / " in ok.stdout and "fit task.max_prompt_tokens=" in ok.stdout, ok.stdout
    args = [f"--config={TINY_ESSA}", "--config.task.max_prompt_tokens=1"]
    dry = run("essa_jax.main", *args, "--dry_run", cwd=tmp_path)
    line = one_error_line(dry, "config.task.max_prompt_tokens = 1 is invalid", "train prompts")
    assert os.listdir(tmp_path) == []  # a dry run writes nothing
    real = run("essa_jax.main", *args, f"--workdir={tmp_path / 'w'}", cwd=tmp_path)
    assert one_error_line(real) == line  # the same check, the same words
    assert not os.path.exists(tmp_path / "w" / "checkpoints" / "0")  # no step was written


def test_a_run_that_cannot_fit_is_refused_before_any_weight_is_read(tmp_path):
    """A real run of a population of 10^6 ends in the plan's one line, not in the kernel's OOM
    killer: the model's weights here are not even a safetensors file, so reading them would fail
    with another message, and the workdir is never created."""
    model = tmp_path / "model"
    model.mkdir()
    hf = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 256,
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 256, "bos_token_id": 1, "eos_token_id": 2,
    }  # fmt: skip
    (model / "config.json").write_text(json.dumps(hf))
    (model / "model.safetensors").write_bytes(b"not a safetensors file")
    proc = run(
        "essa_jax.main",
        f"--config={TINY_ESSA}",
        f"--workdir={tmp_path}/run",
        f"--config.model.path={model}",
        "--config.essa.population_size=1000000",
        cwd=tmp_path,
    )
    one_error_line(proc, "essa_population does not fit", "checked before any weight is read")
    assert not os.path.exists(tmp_path / "run")


# -- multi-process flags --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, env, expected",
    [
        (
            ["--coordinator_address=127.0.0.1:12345"],
            {},
            ("--coordinator_address is set but --num_processes and --process_id are not",),
        ),
        (
            ["--process_id=1"],
            {},
            ("--process_id is set but --coordinator_address and --num_processes are not",),
        ),
        (["--num_processes=2"], {}, ("num_processes=2 needs coordinator_address and process_id",)),
        (
            ["--num_processes=2", "--process_id=0"],
            {"JAX_COORDINATOR_ADDRESS": ""},
            ("needs coordinator_address",),
        ),
        (
            [],
            {"JAX_COORDINATOR_ADDRESS": "127.0.0.1:12345"},
            ("--coordinator_address is set", "$JAX_NUM_PROCESSES / $JAX_PROCESS_ID"),
        ),
    ],
)
def test_partial_multi_process_flags_are_one_line_even_in_a_dry_run(flags, env, expected, tmp_path):
    proc = run(
        "essa_jax.main",
        f"--config={TINY_ESSA}",
        "--dry_run",
        *flags,
        cwd=tmp_path,
        env_extra=env,
    )
    line = one_error_line(proc, *expected)
    assert "--num_processes" in line  # names what a multi-process run needs


# -- plot -----------------------------------------------------------------------------------------

ROWS = [
    {"phase": "eval", "step": 0, "wall_s": 0.0, "tokens": 0, "acc": 0.2},
    {"phase": "train", "step": 1, "wall_s": 1.0, "tokens": 10, "reward": 0.5},
    {"phase": "eval", "step": 1, "wall_s": 1.0, "tokens": 10, "acc": 0.3},
]


def test_plot_of_a_missing_or_empty_folder_is_one_line(tmp_path):
    one_error_line(run("essa_jax.plot", str(tmp_path / "nope"), cwd=tmp_path), "no such folder")
    (tmp_path / "runs" / "a").mkdir(parents=True)
    (tmp_path / "runs" / "a" / "metrics.jsonl").write_text("")  # a run killed before its first row
    one_error_line(
        run("essa_jax.plot", str(tmp_path / "runs"), cwd=tmp_path), "no run with metrics"
    )
    assert os.listdir(tmp_path / "runs") == ["a"]  # no plot written


def test_plot_skips_a_truncated_last_line_with_a_note(tmp_path):
    wd = tmp_path / "runs" / "essa"
    wd.mkdir(parents=True)
    text = "".join(json.dumps(r) + "\n" for r in ROWS) + '{"phase": "train", "ste'
    (wd / "metrics.jsonl").write_text(text)
    for folder in (tmp_path / "runs", wd):  # a folder of runs, or one run's workdir
        proc = run("essa_jax.plot", str(folder), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("note: "), proc.stderr
        assert "metrics.jsonl: line 4 is incomplete" in lines[0] and "skipped" in lines[0]
        assert (folder / "compare.png").stat().st_size > 0
    # A damaged line before the last is not a write in progress: one error line.
    (wd / "metrics.jsonl").write_text("{oops\n" + json.dumps(ROWS[0]) + "\n")
    one_error_line(run("essa_jax.plot", str(wd), cwd=tmp_path), "line 1 is not a JSON object")


# -- a run's adapter and its latest checkpoint ----------------------------------------------------


def test_export_records_its_step_and_a_stale_adapter_is_refused_as_sft_start(tmp_path):
    """A finished run's adapter/ carries its step; once the workdir has a newer checkpoint (the run
    resumed for more steps and stopped before its end: simulated by a copy of the last
    checkpoint as a later step), the adapter is refused as another run's SFT start, in one line
    naming both steps."""
    from essa_jax.train.export_record import EXPORT_RECORD, stale_export

    wd = tmp_path / "sft"
    proc = run("essa_jax.main", f"--config={DEFAULT}", *TINY_SFT, f"--workdir={wd}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((wd / "adapter" / EXPORT_RECORD).read_text())
    assert record == {"step": 0, "method": "sft"}
    assert stale_export(str(wd / "adapter")) is None
    shutil.copytree(wd / "checkpoints" / "0", wd / "checkpoints" / "3")
    stale = stale_export(str(wd / "adapter"))
    assert "is from step 0" in stale and "latest checkpoint is step 3" in stale
    before = (wd / "adapter" / EXPORT_RECORD).read_text()
    proc = run(
        "essa_jax.main",
        f"--config={DEFAULT}",
        *TINY_SFT,
        f"--config.sft.init_from={wd}/adapter",
        f"--workdir={tmp_path}/next",
        "--nomemory_check",
        cwd=tmp_path,
    )
    one_error_line(proc, "config.sft.init_from", "is from step 0", "latest checkpoint is step 3")
    assert (wd / "adapter" / EXPORT_RECORD).read_text() == before  # the earlier output intact


def test_an_export_without_a_record_is_judged_by_its_age(tmp_path):
    from essa_jax.train.export_record import stale_export

    (tmp_path / "checkpoints" / "2").mkdir(parents=True)
    (tmp_path / "adapter").mkdir()
    os.utime(tmp_path / "checkpoints" / "2", (1_000, 1_000))
    assert stale_export(str(tmp_path / "adapter")) is None  # written after the last checkpoint
    os.utime(tmp_path / "adapter", (500, 500))
    assert "older than" in stale_export(str(tmp_path / "adapter"))
    shutil.rmtree(tmp_path / "checkpoints")
    assert stale_export(str(tmp_path / "adapter")) is None  # nothing to compare with
