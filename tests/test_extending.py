"""README "Extending": a user's strategy (with a hyper-parameter), advantage weighting (with a
parameter) and method, each one file of the user's plus a config importing it, run through the
command line on a tiny random model; unknown names and config-file fields end in one line and
exit status 2 before the model loads. The files are the README's own `# file:` blocks."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FILES = dict(re.findall(r"```python\n# file: (\S+)\n(.*?)```", README.read_text(), flags=re.S))

# A tiny run: random 2-layer model, one SFT step, one loop step, a few held-out prompts.
TINY = [
    "--config.model.path=random:tiny",
    "--config.task.num_train=16",
    "--config.task.num_heldout=4",
    "--config.lora.rank=2",
    "--config.lora.alpha=4.0",
    "--config.sft.steps=1",
    "--config.sft.batch_size=4",
    "--config.essa.population_size=4",
    "--config.essa.prompts_per_candidate=2",
    "--config.essa.generations=2",
    "--config.grpo.steps=1",
    "--config.grpo.batch_size=4",
    "--config.grpo.group_size=2",
    "--config.eval.batch_size=4",
    "--config.eval.every=0",
    "--config.eval.base_model=False",
    "--config.eval.pass_k_samples=0",
    "--config.task.reward=char_match",
]


@pytest.fixture
def user_dir(tmp_path):
    """The README's files in a folder of the user's (not the repository's)."""
    assert {"my_es.py", "my_es_config.py", "my_weighting.py", "my_grpo_config.py"} <= set(FILES)
    folder = tmp_path / "mine"
    folder.mkdir()
    for name, text in FILES.items():
        (folder / name).write_text(text)
    return folder


def run_main(config: Path, workdir: Path, *args: str) -> subprocess.CompletedProcess:
    # Run from elsewhere: the config file's folder, not the cwd, makes its modules importable.
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    env.pop("XLA_FLAGS", None)
    return subprocess.run(
        [sys.executable, "-m", "essa_jax.main", f"--config={config}", f"--workdir={workdir}",
         *args],
        cwd=str(workdir.parent),
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )  # fmt: skip


def one_line_exit_2(proc: subprocess.CompletedProcess, *expected: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for e in expected:
        assert e in lines[0], lines[0]
    assert "model random:tiny" not in proc.stdout  # the model was never loaded


def summary(workdir: Path) -> dict:
    with open(workdir / "summary.json") as f:
        return json.load(f)


def metrics(workdir: Path) -> list[dict]:
    with open(workdir / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]


@pytest.mark.slow
def test_custom_strategy_with_its_hyper_parameter(user_dir, tmp_path):
    work = tmp_path / "run_es"
    args = ("--config.essa.strategy_args.decay=0.5", "--config.essa.skip_flat=False")
    proc = run_main(user_dir / "my_es_config.py", work, *TINY, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [r for r in metrics(work) if r["phase"] == "train"]
    assert [r["step"] for r in rows] == [1, 2]
    # The loop read the user's state (mean, scalar sigma): essa.sigma_init 0.1 decayed by the
    # overridden 0.5 at each tell, and the mean moved.
    assert rows[0]["sigma"] == pytest.approx(0.05) and rows[1]["sigma"] == pytest.approx(0.025)
    assert rows[0]["update_norm"] > 0
    assert json.load(open(work / "config.json"))["essa"]["strategy_args"] == {"decay": 0.5}


@pytest.mark.slow
def test_custom_weighting_and_method(user_dir, tmp_path):
    work = tmp_path / "run_w"
    proc = run_main(user_dir / "my_grpo_config.py", work, *TINY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary(work)["method"] == "grpo"
    # The user's method (GRPO with the weighting preset) from the same files.
    work = tmp_path / "run_m"
    proc = run_main(user_dir / "my_grpo_config.py", work, *TINY, "--config.method=hard_grpo")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary(work)["method"] == "hard_grpo"
    assert [r["step"] for r in metrics(work) if r["phase"] == "train"] == [1]


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--config.essa.strategy=snes"], ("config.essa.strategy = 'snes'", "'mu_lambda_es'")),
        (["--config.essa.strategy_args.decay=1.5"], ("config.essa.strategy_args", "decay")),
        (["--config.method=grpo", "--config.grpo.weighting=nope"],
         ("config.grpo.weighting = 'nope'", "'focal'")),
        (["--config.method=nope"], ("config.method = 'nope'", "'essa'", "register_method")),
    ],
)  # fmt: skip
def test_unknown_names_end_in_one_line_before_loading(user_dir, tmp_path, args, expected):
    proc = run_main(user_dir / "my_es_config.py", tmp_path / "w", *TINY, *args)
    one_line_exit_2(proc, *expected)


def test_unknown_field_in_a_config_file(user_dir, tmp_path):
    config = user_dir / "typo_config.py"
    config.write_text(
        "from my_es_config import get_config as mine\n\n\n"
        "def get_config():\n"
        "    c = mine()\n"
        "    c.grpo.weightng = 'reward_var'\n"  # a typo: no such field
        "    return c\n"
    )
    proc = run_main(config, tmp_path / "w", *TINY)
    one_line_exit_2(proc, "config.grpo.weightng", "did you mean 'weighting'")
    assert not (tmp_path / "w" / "config.json").exists()  # nothing written


def test_strategy_args_are_checked_by_building_the_strategy():
    """A built-in strategy's own settings are reachable from the config (CMA-ES's num_parents);
    an argument it does not take, or one the run sets, is a ConfigError on the field."""
    from essa_jax.config import ConfigError, base_config
    from essa_jax.train import validate_config
    from essa_jax.train.essa import make_strategy

    c = base_config()
    c.model.path = "random:tiny"
    c.essa.population_size = 8
    c.essa.strategy_args = {"num_parents": 2, "eigen_interval": 3}
    validate_config(c, num_devices=1)
    strategy = make_strategy(c.essa, 10)
    assert (strategy.num_parents, strategy.eigen_interval, strategy.sigma_init) == (2, 3, 0.1)
    for args, words in (
        ({"bogus": 1}, ("bogus",)),
        ({"num_parents": 9}, ("num_parents",)),  # more parents than the population of 8
        ({"sigma_init": 0.5}, ("sigma_init", "config.essa's own fields")),
    ):
        c.essa.strategy_args = args
        with pytest.raises(ConfigError) as e:
            validate_config(c, num_devices=1)
        assert e.value.field == "essa.strategy_args", str(e.value)
        assert all(w in str(e.value) for w in words), str(e.value)


def test_the_plan_imports_the_config_files_neighbours(user_dir, tmp_path):
    """`python -m essa_jax.plan` loads the user's config like the run does (its modules beside
    it) and plans the user's method's programs: GRPO's, with the preset weighting."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "essa_jax.plan", f"--config={user_dir / 'my_grpo_config.py'}",
         *TINY, "--config.method=hard_grpo", "--devices=1", "--device_memory_gb=1"],
        cwd=str(tmp_path),
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "(hard_grpo)" in proc.stdout
    for program in ("sft_step", "grpo_rollout", "grpo_update", "heldout_eval"):
        assert program in proc.stdout, proc.stdout
