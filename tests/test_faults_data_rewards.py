"""Nothing silently wrong, round two (issue #44, part A): task data and rewards.

A reward that cannot score some completions (NaN / inf, an exception) is counted per step in
metrics.jsonl and for the run in summary.json, warned about, and past
`task.max_reward_failure_fraction` stops the run in one line with its checkpoints kept; prompts
that cannot run (every one longer than `task.max_prompt_tokens`, or past the model's context) end
in one line before any weight is read; training examples that repeat a held-out prompt are
removed and counted in the run's record. Each case runs `python -m essa_jax.main` on the tiny
random model (tests/distributed/tiny_essa_config.py) in a subprocess.
"""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cli_runs import cli_env

from essa_jax.checkpointing import complete_steps

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "tests" / "distributed" / "tiny_essa_config.py"
ESSA = ["--config.essa.generations=2", "--config.checkpoint.every=0"]
GRPO = [
    "--config.method=grpo",
    "--config.grpo.steps=2",
    "--config.grpo.batch_size=8",
    "--config.grpo.group_size=4",
    "--config.checkpoint.every=0",
]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return cli_env(str(tmp_path_factory.mktemp("jax_cache")))


def run(env, workdir, *args, config=CONFIG, **kw) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "essa_jax.main", f"--config={config}", f"--workdir={workdir}"]
    return subprocess.run(
        [*cmd, *args], cwd=ROOT, env={**env, **kw}, capture_output=True, text=True, timeout=600
    )


def error_line(proc: subprocess.CompletedProcess, *expected: str) -> str:
    """Exit status 2, no traceback, and one `error:` line (the last) holding every `expected`."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    errors = [x for x in lines if x.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], proc.stderr[-3000:]
    for e in expected:
        assert e in errors[0], (e, errors[0])
    return errors[0]


def rows(workdir) -> list[dict]:
    text = (Path(workdir) / "metrics.jsonl").read_text()
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def summary(workdir) -> dict:
    return json.loads((Path(workdir) / "summary.json").read_text())


# A user's reward, registered by a module beside the config (README "A custom reward"): the dense
# char_match reward, NaN for problems whose answer is a multiple of 5 and an exception for those
# whose answer is a multiple of 7 (every call of the guard: a batch holding one raises as a whole,
# then each completion is scored alone). It writes down each NaN it returned and each exception of
# a one-completion call: exactly the completions the guard must count.
PATCHY_REWARD = """
import math
import os

from essa_jax.rewards import char_match_reward, register_reward


def patchy(prompts, completions, answer, **_):
    out = char_match_reward(prompts, completions, answer=answer)
    with open(os.environ["REWARD_LOG"], "a") as log:
        if any(int(a) % 7 == 0 for a in answer):
            if len(completions) == 1:
                log.write("raise\\n")
            raise ZeroDivisionError("the user's bug")
        out = [math.nan if int(a) % 5 == 0 else v for v, a in zip(out, answer)]
        log.write("nan\\n" * sum(math.isnan(v) for v in out))
    return out


register_reward("patchy", patchy)
"""

# NaN for every third completion of each call: a third of every batch, past the 0.1 default.
THIRD_NAN_REWARD = """
import math

from essa_jax.rewards import char_match_reward, register_reward


def third_nan(prompts, completions, answer, **_):
    out = char_match_reward(prompts, completions, answer=answer)
    return [math.nan if i % 3 == 0 else v for i, v in enumerate(out)]


register_reward("third_nan", third_nan)
"""

USER_CONFIG = """
import {module}  # registers the reward

from essa_jax.config import load_config_file


def get_config():
    c = load_config_file({config!r})
    c.task.reward = {reward!r}
    return c
"""


def user_config(tmp_path: Path, module: str, text: str, reward: str) -> Path:
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(text))
    cfg = tmp_path / f"{module}_config.py"
    cfg.write_text(
        textwrap.dedent(USER_CONFIG.format(module=module, config=str(CONFIG), reward=reward))
    )
    return cfg


@pytest.mark.parametrize("method", ["essa", "grpo"])
def test_reward_failures_are_counted_per_step_and_in_the_summary(env, tmp_path, method):
    cfg = user_config(tmp_path, "patchy_reward", PATCHY_REWARD, "patchy")
    log = tmp_path / "reward.log"
    work = tmp_path / "run"
    args = ESSA if method == "essa" else GRPO
    proc = run(
        env,
        work,
        *args,
        "--config.task.max_reward_failure_fraction=0.9",  # ~1 in 3 fail: counted, not stopped
        config=cfg,
        REWARD_LOG=str(log),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged = log.read_text().split()
    s = summary(work)
    # The run's totals are exactly what the reward did: every NaN, every exception.
    assert s["reward_nonfinite"] == logged.count("nan") > 0
    assert s["reward_raised"] == logged.count("raise") > 0
    assert s["reward_timeouts"] == 0
    assert s["reward_failures"] == s["reward_nonfinite"] + s["reward_raised"]
    train = [r for r in rows(work) if r["phase"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        assert r["reward_failures"] == r["reward_nonfinite"] + r["reward_raised"]
    # Each row counts its step's completions (the rollouts), the totals the evaluations' too.
    assert sum(r["reward_scored"] for r in train) == s["rollouts"] > 0
    evals = [r for r in rows(work) if r["phase"] in ("eval", "test")]
    assert s["reward_scored"] == s["rollouts"] + sum(r["n"] for r in evals)
    assert sum(r["reward_failures"] for r in train) <= s["reward_failures"]
    # Warned about: at the first step with failures, and for the run.
    assert "reward 'patchy' could not score" in proc.stderr
    assert "in this run" in proc.stderr and "by step" in proc.stderr


def test_a_reward_failing_past_the_limit_stops_in_one_line_with_its_checkpoints(env, tmp_path):
    cfg = user_config(tmp_path, "third_nan_reward", THIRD_NAN_REWARD, "third_nan")
    work = tmp_path / "run"
    proc = run(env, work, *ESSA, config=cfg)
    line = error_line(
        proc,
        "reward 'third_nan' failed on",
        "> the limit 0.1",
        "task.max_reward_failure_fraction",
        "non-finite",
    )
    assert "non-finite reward nan" in line
    assert not (work / "summary.json").exists()
    # Checkpoint 0 (the SFT start: 8 held-out completions, too few to judge) is intact: the run
    # resumes from it once the limit is raised.
    assert complete_steps(str(work / "checkpoints")) == [0]
    proc = run(
        env,
        work,
        *ESSA,
        "--config.task.max_reward_failure_fraction=0.5",
        "--allow_config_change",
        config=cfg,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resuming from {work}/checkpoints/0" in proc.stdout
    s = summary(work)
    assert s["steps"] == 2 and s["reward_nonfinite"] == s["reward_failures"] > 0


def test_prompts_that_cannot_run_end_in_one_line(env, tmp_path):
    short = run(env, tmp_path / "short", "--config.task.max_prompt_tokens=1")
    error_line(
        short,
        "config.task.max_prompt_tokens = 1",
        "integers >= 45",
        "64 train prompts",
        "45 tokens",
    )
    # Prompts past random:tiny's context of 512 positions (a long instruction on every one).
    long = run(
        env,
        tmp_path / "long",
        "--config.task.max_prompt_tokens=2000",
        "--config.task.instruction=" + "x" * 600,
    )
    error_line(
        long,
        "config.task.max_prompt_tokens = 2000",
        "integers <= 509",
        "context of 512",
        "the longest train prompt is 645 tokens",
    )
    for name, proc in (("short", short), ("long", long)):
        assert "SFT" not in proc.stdout  # stopped before SFT: no step, no checkpoint
        assert complete_steps(str(tmp_path / name / "checkpoints")) == []


def test_prompt_checks_come_before_the_weights(tmp_path, monkeypatch):
    """`build_run` tokenises and checks the prompts against the model's header: a model whose
    weights cannot be read still fails on the prompts (the weights are never asked for)."""
    from essa_jax.config import ConfigError, load_config_file
    from essa_jax.train import pipeline

    def no_weights(*a, **k):
        raise AssertionError("the weights were read before the prompts were checked")

    monkeypatch.setattr(pipeline, "load_model", no_weights)
    c = load_config_file(str(CONFIG))
    c.task.max_prompt_tokens = 1
    with pytest.raises(ConfigError, match=r"task.max_prompt_tokens = 1 .*integers >= 45"):
        pipeline.build_run(c, str(tmp_path), verbose=False)
    c.task.max_prompt_tokens = 2000
    c.generation.max_new_tokens = 500
    with pytest.raises(ConfigError, match=r"integers <= 12 .*45 \+ 500 > 512"):
        pipeline.build_run(c, str(tmp_path), verbose=False)


def test_heldout_duplicates_and_unparsable_lines_in_the_run_record(env, tmp_path):
    """A training file that repeats 3 held-out prompts and holds a line that is not JSON: with
    `on_malformed=skip` the run trains without both, says so, and records both counts."""
    train = [{"question": f"{a} + {a + 1} =", "answer": str(2 * a + 1)} for a in range(10, 30)]
    held = [{"question": f"{a} + {a + 2} =", "answer": str(2 * a + 2)} for a in range(40, 45)]
    held += train[3:6]  # three held-out prompts the training file also has
    lines = [json.dumps(r) for r in train]
    lines.insert(7, '{"question": "cut off')
    (tmp_path / "train.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "held.jsonl").write_text("".join(json.dumps(r) + "\n" for r in held))
    work = tmp_path / "run"
    proc = run(
        env,
        work,
        "--config.method=sft",
        "--config.sft.steps=1",
        "--config.task.name=sums",
        f"--config.task.path={tmp_path / 'train.jsonl'}",
        f"--config.task.eval_path={tmp_path / 'held.jsonl'}",
        "--config.task.prompt_format=chat",
        "--config.task.on_malformed=skip",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "3 training examples removed: their prompt is a held-out one" in proc.stdout
    assert "1 malformed rows skipped" in proc.stdout
    assert "removed 3 training examples whose prompt a held-out" in proc.stderr
    s = summary(work)
    assert s["heldout_duplicates_removed"] == 3 and s["malformed_rows_skipped"] == 1
    assert "17 train / 8 held-out prompts" in proc.stdout
