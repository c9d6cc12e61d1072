"""The runs' persistent compilation cache (essa_jax.compile_cache): which folder each setting
names, that a run writes its programs there and a second process reads them back, and that an
unusable folder or an empty setting is one line."""

import os
import subprocess
import sys

import pytest
from cli_runs import cli_env

from essa_jax import compile_cache as cc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_ESSA = os.path.join(ROOT, "tests", "distributed", "tiny_essa_config.py")


def test_resolve_each_setting(tmp_path):
    home = {"XDG_CACHE_HOME": str(tmp_path)}
    assert cc.resolve("auto", home) == (str(tmp_path / "essa_jax" / "jax_compile"), False)
    assert cc.resolve("off", home) == (None, False)
    assert cc.resolve(str(tmp_path / "c"), home) == (str(tmp_path / "c"), False)
    # JAX's own variable wins, and then JAX's own settings stand (tests set it for every run).
    assert cc.resolve("auto", {**home, cc.JAX_ENV: "/x"}) == ("/x", True)
    assert cc.resolve("auto", {**home, cc.ENV: "off"}) == (None, False)
    assert cc.resolve("auto", {**home, cc.ENV: str(tmp_path / "e")}) == (str(tmp_path / "e"), False)
    with pytest.raises(ValueError, match="use auto, off or a folder"):
        cc.resolve(" ", home)


def _env(**extra):
    env = {k: v for k, v in cli_env().items() if k not in (cc.JAX_ENV, cc.ENV)}
    env.pop("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", None)
    return {**env, **extra}


# Compiles one program slow enough to be kept (MIN_COMPILE_SECONDS is lowered to 0 for the test
# after enable(), as a larger program would pass it), and prints JAX's cache hits.
PROBE = """
import sys, jax, jax.numpy as jnp
from jax import monitoring
from essa_jax import compile_cache
hits = []
monitoring.register_event_listener(lambda e, **k: hits.append(e) if "cache_hits" in e else None)
path = compile_cache.enable(sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.jit(lambda x: jnp.tanh(x @ x.T).sum())(jnp.ones((64, 64))).block_until_ready()
print(path, len(hits))
"""


def test_a_second_process_reads_what_the_first_compiled(tmp_path):
    env = _env(XDG_CACHE_HOME=str(tmp_path / "home"))
    first = subprocess.run(
        [sys.executable, "-c", PROBE, "auto"], env=env, capture_output=True, text=True, timeout=300
    )
    assert first.returncode == 0, first.stderr[-2000:]
    folder = tmp_path / "home" / "essa_jax" / "jax_compile"
    assert first.stdout.split() == [str(folder), "0"]  # a cold cache: compiled, then written
    assert any(folder.iterdir())
    second = subprocess.run(
        [sys.executable, "-c", PROBE, "auto"], env=env, capture_output=True, text=True, timeout=300
    )
    # The first process's programs (the jit and jnp.ones' own) are read back.
    path, hits = second.stdout.split()
    assert path == str(folder) and int(hits) >= 1, second.stderr[-2000:]
    off = subprocess.run(
        [sys.executable, "-c", PROBE, "off"], env=env, capture_output=True, text=True, timeout=300
    )
    assert off.stdout.split() == ["None", "0"], off.stderr[-2000:]


def test_an_unusable_folder_is_a_warning_and_the_program_compiles(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(blocker / "cache")],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and proc.stdout.split() == ["None", "0"], proc.stderr[-2000:]
    warning = [line for line in proc.stderr.splitlines() if "--compile_cache" in line]
    assert len(warning) == 1 and warning[0].startswith("warning: --compile_cache "), proc.stderr


def test_main_uses_the_folder_and_refuses_an_empty_setting(tmp_path):
    folder = tmp_path / "cache"
    # Every compile kept: the tiny config's programs compile in well under MIN_COMPILE_SECONDS.
    keep_all = _env(JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    ok = subprocess.run(
        [sys.executable, "-m", "essa_jax.main", f"--config={TINY_ESSA}", "--dry_run",
         f"--compile_cache={folder}"],
        cwd=tmp_path, env=keep_all, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr[-2000:]
    # The dry run's memory check compiles the run's programs ahead of time: they are kept.
    assert folder.is_dir() and any(folder.iterdir())
    bad = subprocess.run(
        [sys.executable, "-m", "essa_jax.main", f"--config={TINY_ESSA}", "--dry_run",
         "--compile_cache="],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "error: --compile_cache '': use auto, off or a folder"
    ], bad.stderr[-2000:]
