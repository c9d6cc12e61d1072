"""The command line helps: `--help` (exit 0: the commands, every shipped config with its purpose,
the flags), `--print_config` (every field with its value and the schema's comment) and
`--dry_run` / `--only_check_args` (validate, exit 0 or 2), run as a user runs them."""

import ast
import glob
import os

import pytest
from test_cli_errors import run_main

from essa_jax.config import base_config
from essa_jax.config_fields import comments_of, field_comments

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "experiments", "configs", "*.py")))
GRPO = os.path.join(ROOT, "experiments", "configs", "grpo_smollm2_arith.py")


@pytest.mark.parametrize("flag", ["--help", "-h", "--helpfull"])
def test_help_exits_0_with_commands_configs_and_flags(flag):
    out = run_main(flag, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "python -m essa_jax.main --config" in out.stdout
    assert "python -m essa_jax.plan --config" in out.stdout
    assert CONFIGS
    for path in CONFIGS:
        with open(path) as f:
            purpose = ast.get_docstring(ast.parse(f.read())).strip().splitlines()[0]
        name = f"configs/{os.path.basename(path)} "
        line = next(ln for ln in out.stdout.splitlines() if name in ln)
        assert purpose in line, (path, line)
    for name in ("--config", "--workdir", "--print_config", "--dry_run", "--resume"):
        assert f"  {name}:" in out.stdout, name


def test_field_comments_come_from_the_schema_source():
    comments = field_comments()
    leaves = []

    def walk(node, prefix=""):
        for k in node.keys():
            if hasattr(node[k], "keys"):
                walk(node[k], prefix + k + ".")
            else:
                leaves.append(prefix + k)

    walk(base_config())
    assert set(leaves) <= set(comments)  # every field is assigned in base_config
    # a block above, an inline comment, a block above plus one inside a multi-line assignment
    assert comments["model.remat"].startswith("Checkpoint each decoder layer")
    assert comments["lora.rank"] == "r"
    assert comments["eval.every"].startswith("held-out eval of the current policy")
    assert comments["mesh"].startswith("The one device mesh of every program")

    def sample():
        c = {}
        # first
        # block
        c.a = 1  # inline

        c.b = 2
        c.c = 3  # inside
        return c

    assert comments_of(sample) == {"a": "first block inline", "b": "", "c": "inside"}


def test_print_config_prints_every_field_with_value_and_comment():
    out = run_main(f"--config={GRPO}", "--config.grpo.steps=7", "--print_config", cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert "grpo.steps = 7" in lines  # the override, not the config file's value
    assert "method = 'grpo'" in lines  # the config file's value, not the schema default
    # the comment, wrapped under its field
    at = lines.index("lora.rank = 4")
    assert lines[at + 1].strip() == "r"
    text = " ".join(ln.strip() for ln in lines)
    for path, comment in field_comments().items():
        assert f"{path} = " in out.stdout or f"[{path}]" in out.stdout, path
        assert " ".join(comment.split()) in text, path


@pytest.mark.parametrize("flag", ["--dry_run", "--only_check_args"])
def test_dry_run_exits_0_or_2_without_a_workdir(flag, tmp_path):
    ok = run_main(f"--config={GRPO}", "--config.model.path=random:tiny", flag, cwd=str(tmp_path))
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "config OK" in ok.stdout
    bad = run_main(f"--config={GRPO}", "--config.lora.rank=0", flag, cwd=str(tmp_path))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines() == [
        "error: config.lora.rank = 0 is invalid: valid values are integers >= 1"
    ]
    assert os.listdir(tmp_path) == []  # nothing written
