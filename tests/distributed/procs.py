"""Starting the multi-process test workers: a clean environment and a checked, bounded run."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def worker_env(tmp_path, devices=None):
    """os.environ without the JAX_* process variables (each launch sets its own), with a
    compilation cache shared by the runs of one test (the 1x8 and 2x4 programs compile alike), and
    `devices` host devices per process when given."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
    }
    env["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path / "jax_cache")
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    if devices is not None:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return env


def run_bounded(cmd, env, timeout=420):
    """Run `cmd` from the repository root in its own session; return (exit code, stdout + stderr).
    After `timeout` seconds its whole process group is killed and the test fails with the
    output's tail."""
    p = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        out, _ = p.communicate()
        pytest.fail(f"timed out after {timeout}s: {cmd}\n{out[-3000:]}")
    return p.returncode, out


def run_checked(cmd, env, timeout=420):
    """`run_bounded`, failing the test (with the output's tail) on a non-zero exit."""
    rc, out = run_bounded(cmd, env, timeout)
    assert rc == 0, out[-4000:]
