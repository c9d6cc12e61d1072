"""A user's mistake on the command line ends in one line on stderr and exit status 2.

Each case runs `python -m essa_jax.main` as a subprocess, the way a user does, and checks the
whole of stderr: exactly one line, "error: ...", naming what is wrong and what would be valid, and
no traceback. Cases: an unknown config field, a value of the wrong type, a config file that does
not exist, a model file that is not GGUF or is truncated, an unsupported architecture, a malformed
row of a task file, a reward function that raises, and --resume on a workdir with no checkpoint.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from cli_runs import TINY_SFT, cli_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(ROOT, "experiments", "configs", "essa_smollm2_arith.py")

TINY = TINY_SFT  # reaches data loading and reward scoring in seconds

RAISING_REWARD_CONFIG = """
from essa_jax.config import load_config_file
from essa_jax.rewards import REWARDS, register_reward


def broken_reward(prompts, completions, **_):
    raise KeyError("answer_text")  # a typo in a user's field name


if "broken" not in REWARDS:
    register_reward("broken", broken_reward)


def get_config():
    c = load_config_file({default!r})
    c.task.reward = "broken"
    return c
"""


def run_main(*args: str, cwd: str) -> subprocess.CompletedProcess:
    env = cli_env()  # one device: nothing here is about sharding
    return subprocess.run(
        [sys.executable, "-m", "essa_jax.main", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def assert_one_line(proc: subprocess.CompletedProcess, *expected: str, besides: str = "") -> str:
    """Exit 2 and exactly one stderr line holding `expected` (lines holding `besides`, a warning
    the user asked for, aside)."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.strip().splitlines() if not (besides and besides in ln)]
    assert len(lines) == 1, proc.stderr[-3000:]
    line = lines[0]
    assert line.startswith("error: "), line
    for e in expected:
        assert e in line, (e, line)
    return line


@pytest.mark.parametrize(
    "override, expected",
    [
        (
            "--config.essa.popsize=3",
            ("config.essa has no field 'popsize'", "did you mean 'population_size'?"),
        ),
        ("--config.esa.generations=3", ("config has no field 'esa'", "did you mean 'essa'")),
        ("--config.essa.population_size=abc", ("essa.population_size", "invalid literal for int")),
        ("--config.essa.sigma_init=-1", ("essa.sigma_init", "-1")),
        ("--config.task.on_malformed=ignore", ("task.on_malformed", "'error'", "'skip'")),
        # Non-finite floats and unknown choices: found before any weight is read (issue #31).
        (
            "--config.sft.learning_rate=inf",
            ("config.sft.learning_rate = inf", "finite numbers > 0"),
        ),
        ("--config.essa.sigma_init=inf", ("config.essa.sigma_init = inf", "finite numbers > 0")),
        ("--config.lora.alpha=inf", ("config.lora.alpha = inf", "finite numbers > 0")),
        ("--config.essa.temperature=nan", ("config.essa.temperature = nan", "finite numbers")),
        ("--config.essa.strategy=cmaes", ("config.essa.strategy = 'cmaes'", "'cma_es'")),
    ],
)
def test_bad_config_field(override, expected, tmp_path):
    proc = run_main(f"--config={DEFAULT}", f"--workdir={tmp_path}/run", override, cwd=tmp_path)
    assert_one_line(proc, *expected)
    assert not os.path.exists(tmp_path / "run")  # refused before the workdir is touched


@pytest.mark.parametrize("temperature", ["0", "-1"])
def test_sampling_temperature_must_be_positive(temperature, tmp_path):
    proc = run_main(
        f"--config={DEFAULT}",
        f"--workdir={tmp_path}/run",
        "--config.essa.greedy=False",
        f"--config.essa.temperature={temperature}",
        cwd=tmp_path,
    )
    assert_one_line(
        proc, f"config.essa.temperature = {float(temperature)}", "finite numbers > 0",
        "--config.essa.greedy=True",
    )  # fmt: skip


@pytest.mark.parametrize(
    "name, content, expected",
    [
        ("train.jsonl", b"", ("the file is empty",)),
        ("train.csv", b"question,answer\n", ("no rows (a header or an empty list only)",)),
        (
            "train.jsonl",
            b'{"question": "caf\xe9?", "answer": "1"}\n',
            ("line 1 (byte 17)", "is not UTF-8"),
        ),
        ("train.txt", b"What is 1 + 1?\n", ("unsupported task file type '.txt'", "'.jsonl'")),
    ],
)
def test_unreadable_data_file(name, content, expected, tmp_path):
    path = tmp_path / name
    path.write_bytes(content)
    args = [f"--config={DEFAULT}", *TINY, "--config.task.name=sums", f"--config.task.path={path}"]
    proc = run_main(*args, f"--workdir={tmp_path}/run", cwd=tmp_path)
    assert_one_line(proc, str(path), *expected)


def test_no_row_left_after_skipping_malformed_ones(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"question": "What is 1 + 1?"}\n{"question": "What is 2 + 2?"}\n')
    args = [f"--config={DEFAULT}", *TINY, "--config.task.name=sums", f"--config.task.path={path}"]
    proc = run_main(
        *args, "--config.task.on_malformed=skip", f"--workdir={tmp_path}/r", cwd=tmp_path
    )
    assert_one_line(proc, f"{path}: no usable row: 2 rows, 2 skipped as malformed")


def test_checkpoint_directory_without_tokenizer_files(tmp_path):
    """An HF directory whose tokenizer files were not copied: named before the weights are read."""
    model = tmp_path / "model"
    model.mkdir()
    hf = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64,
        "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 128, "bos_token_id": 1, "eos_token_id": 2,
    }  # fmt: skip
    (model / "config.json").write_text(json.dumps(hf))
    proc = run_main(
        f"--config={DEFAULT}", f"--workdir={tmp_path}/run", f"--config.model.path={model}",
        *TINY[2:], cwd=tmp_path,
    )  # fmt: skip
    assert_one_line(proc, f"{model}: no tokenizer files", "--config.model.tokenizer")


def test_missing_config_file(tmp_path):
    proc = run_main(f"--config={tmp_path}/nope.py", f"--workdir={tmp_path}/run", cwd=tmp_path)
    assert_one_line(proc, f"{tmp_path}/nope.py: no such file")


@pytest.mark.parametrize("case", ["not_gguf", "truncated_gguf", "unsupported_arch"])
def test_unreadable_model(case, tmp_path, smollm2_gguf_path):
    if case == "not_gguf":
        path = tmp_path / "model.gguf"
        path.write_text("hello")
        expected = (str(path), "not a readable GGUF file (GGUF magic invalid)")
    elif case == "truncated_gguf":
        path = tmp_path / "model.gguf"
        with open(smollm2_gguf_path, "rb") as f:
            path.write_bytes(f.read(5_000_000))
        expected = (str(path), "not a readable GGUF file")
    else:
        path = tmp_path / "gpt2"
        path.mkdir()
        (path / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"]}')
        expected = ("unsupported architecture 'GPT2LMHeadModel'",)
    proc = run_main(
        f"--config={DEFAULT}",
        f"--workdir={tmp_path}/run",
        f"--config.model.path={path}",
        cwd=tmp_path,
    )
    assert_one_line(proc, *expected)


def _task_file(tmp_path) -> str:
    rows = [
        {"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"}
        for i in range(20)
    ]
    rows[7] = {"question": "What is 7 + 1?"}  # no answer
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_malformed_data_row(tmp_path):
    path = _task_file(tmp_path)
    args = [f"--config={DEFAULT}", *TINY, "--config.task.name=sums", f"--config.task.path={path}"]
    proc = run_main(*args, f"--workdir={tmp_path}/run", cwd=tmp_path)
    assert_one_line(
        proc,
        f"{path}: row 7 (counting from 0)",
        "missing answer field",
        "row has ['question']",
        "--config.task.on_malformed=skip",
    )
    # Skipped instead, the row is gone; the default's prefilled format needs generated data.
    proc = run_main(
        *args, "--config.task.on_malformed=skip", f"--workdir={tmp_path}/skip", cwd=tmp_path
    )
    assert_one_line(
        proc,
        "task.prompt_format = 'prefill'",
        "'chat'",
        "no 'prefill' text",
        besides="1 malformed rows skipped (first: row 7",
    )
    proc = run_main(
        *args,
        "--config.task.on_malformed=skip",
        "--config.task.prompt_format=chat",
        f"--workdir={tmp_path}/skip",
        cwd=tmp_path,
    )
    # With a format the data has, the run goes through and states and counts the skipped row.
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "1 malformed rows skipped" in proc.stdout
    with open(tmp_path / "skip" / "summary.json") as f:
        assert json.load(f)["malformed_rows_skipped"] == 1


def test_reward_function_that_raises(tmp_path):
    cfg = tmp_path / "broken_reward_config.py"
    cfg.write_text(textwrap.dedent(RAISING_REWARD_CONFIG.format(default=DEFAULT)))
    # 16 held-out problems: the guard judges a reward broken once 16 completions are scored.
    args = [f"--config={cfg}", *TINY, "--config.task.num_heldout=16"]
    proc = run_main(*args, f"--workdir={tmp_path}/run", cwd=tmp_path)
    assert_one_line(
        proc, "reward 'broken_reward' failed on 16 of 16", "KeyError", "--config.task.reward"
    )


def test_resume_without_a_checkpoint(tmp_path):
    proc = run_main(f"--config={DEFAULT}", f"--workdir={tmp_path}/run", "--resume", cwd=tmp_path)
    assert_one_line(proc, "--resume: no complete checkpoint in", "drop --resume")
