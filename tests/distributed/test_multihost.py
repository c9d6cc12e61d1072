"""essa_jax.distributed and the local launcher: settings, mesh, fitness gather, bounded failures."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import pytest
from procs import run_bounded

from essa_jax import distributed as D

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = ROOT / "experiments" / "launch_local.py"
HERE = Path(__file__).resolve().parent
P = 16  # population of allgather_worker.py
JAX_ENV = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in JAX_ENV}
    env.update(extra)
    return env


def _run(cmd, timeout, env=None):
    """(exit code, output) of `cmd`, its whole process group killed on timeout (`procs`)."""
    return run_bounded(cmd, env or _clean_env(), timeout)


def _free_port():
    sys.path.insert(0, str(LAUNCHER.parent))
    try:
        from launch_local import free_port
    finally:
        sys.path.pop(0)
    return free_port()


# -- settings ----------------------------------------------------------------------------------


def test_resolve_settings_env_and_errors(monkeypatch):
    for k in JAX_ENV:
        monkeypatch.delenv(k, raising=False)
    assert D.resolve_settings() == (None, None, None)
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "127.0.0.1:1234")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "4")
    monkeypatch.setenv("JAX_PROCESS_ID", "3")
    assert D.resolve_settings() == ("127.0.0.1:1234", 4, 3)
    assert D.resolve_settings(process_id=1) == ("127.0.0.1:1234", 4, 1)
    with pytest.raises(ValueError, match=r"process_id=4 is invalid: valid values are 0\.\.3"):
        D.resolve_settings(process_id=4)
    monkeypatch.setenv("JAX_NUM_PROCESSES", "two")
    with pytest.raises(ValueError, match="JAX_NUM_PROCESSES='two'"):
        D.resolve_settings()
    for k in JAX_ENV:
        monkeypatch.delenv(k)
    with pytest.raises(ValueError, match="needs coordinator_address and process_id"):
        D.resolve_settings(num_processes=2)
    with pytest.raises(ValueError, match="coordinator_address='localhost' is invalid"):
        D.resolve_settings("localhost", 2, 0)
    with pytest.raises(ValueError, match="timeout_s=0 is invalid"):
        D.initialize(timeout_s=0)
    with pytest.raises(ValueError, match="num_processes=None / process_id=None are not"):
        D.initialize("127.0.0.1:1234")


def test_single_process_initialize_is_a_noop(monkeypatch):
    for k in JAX_ENV:
        monkeypatch.delenv(k, raising=False)
    info = D.initialize()
    assert (info.process_id, info.num_processes, info.is_main) == (0, 1, True)
    assert info.global_device_count == jax.device_count() == 8
    assert D.is_main_process()


# -- launcher (no jax in the children: fast) -----------------------------------------------------


def test_launcher_stops_everyone_when_one_fails():
    child = (
        "import os, sys, time; i = int(os.environ['JAX_PROCESS_ID']); "
        "e = os.environ; "
        "print('rank', i, 'of', e['JAX_NUM_PROCESSES'], e['JAX_COORDINATOR_ADDRESS'], flush=True); "
        "time.sleep(0.5); sys.exit(7) if i == 2 else time.sleep(120)"
    )
    t0 = time.monotonic()
    rc, out = _run(
        [
            sys.executable,
            str(LAUNCHER),
            "-n",
            "3",
            "--grace",
            "1",
            "--",
            sys.executable,
            "-c",
            child,
        ],
        timeout=60,
    )
    assert rc == 7, out
    assert time.monotonic() - t0 < 30  # the sleepers were killed, not waited for
    assert "[launch] process 2 exited with 7" in out
    for i in range(3):
        assert f"[p{i}] rank {i} of 3 127.0.0.1:" in out


def test_launcher_timeout_and_signal_codes():
    rc, out = _run(
        [
            sys.executable,
            str(LAUNCHER),
            "-n",
            "2",
            "--timeout",
            "2",
            "--grace",
            "1",
            "--",
            sys.executable,
            "-c",
            "import time; time.sleep(60)",
        ],
        timeout=60,
    )
    assert rc == 124 and "timeout" in out
    kill_self = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    rc, _ = _run(
        [sys.executable, str(LAUNCHER), "-n", "1", "--", sys.executable, "-c", kill_self],
        timeout=60,
    )
    assert rc == 128 + 9


# -- real multi-process jax (gloo over 127.0.0.1) -------------------------------------------------


@pytest.mark.multiprocess
def test_two_processes_score_their_own_rows_and_share_the_fitness(tmp_path):
    marker = tmp_path / "main_only.txt"
    rc, out = _run(
        [
            sys.executable,
            str(LAUNCHER),
            "-n",
            "2",
            "--devices-per-process",
            "4",
            "--timeout",
            "120",
            "--",
            sys.executable,
            str(HERE / "allgather_worker.py"),
            str(marker),
        ],
        timeout=180,
    )
    assert rc == 0, out
    # raw_decode: another process's stderr (gloo's connect message) may land on the same line.
    decoder = json.JSONDecoder()
    results = [
        decoder.raw_decode(line.split("RESULT ", 1)[1])[0]
        for line in out.splitlines()
        if "RESULT " in line
    ]
    assert sorted(r["process_id"] for r in results) == [0, 1]
    # Fitness of member m = mean over prompts q of (m * 10 + q): exact in float32.
    want = [m * 10 + 0.5 for m in range(P)]
    scored = []
    for r in results:
        assert r["num_processes"] == 2 and r["global_devices"] == 8 and r["local_devices"] == 4
        assert r["mesh"] == {"pop": 8, "data": 1, "model": 1}
        assert r["fitness"] == want  # identical on both processes
        scored.append(r["scored_members"])
    # Each process scored only its own half (the members on its devices), and together all.
    assert sorted(scored) == [list(range(8)), list(range(8, 16))]
    assert marker.read_text() == "written by process 0\n"


@pytest.mark.multiprocess
def test_missing_peer_fails_fast_with_clear_message():
    port = _free_port()
    code = (
        "from essa_jax import distributed as D; "
        f"D.initialize('127.0.0.1:{port}', 2, 0, timeout_s=4, heartbeat_timeout_s=4); "
        "print('UNREACHABLE')"
    )
    t0 = time.monotonic()
    rc, out = _run(
        [sys.executable, "-c", code],
        timeout=90,
        env=_clean_env(XLA_FLAGS="--xla_force_host_platform_device_count=1"),
    )
    elapsed = time.monotonic() - t0
    assert rc == D.INIT_TIMEOUT_EXIT_CODE, out
    assert "UNREACHABLE" not in out
    assert "DistributedInitError: process 0 of 2 could not join the run" in out
    assert f"127.0.0.1:{port} within 4 s" in out
    assert elapsed < 60, elapsed  # bounded: ~4 s of waiting plus interpreter/jax start-up


@pytest.mark.multiprocess
@pytest.mark.slow
def test_peer_killed_mid_run_survivor_aborts_within_heartbeat(tmp_path):
    # Without any launcher: rank 1 SIGKILLs itself after the first gather; rank 0's next gather
    # cannot complete and the coordination service must abort it (heartbeat timeout), not hang.
    port = _free_port()
    code = (
        "import os, signal, time, numpy as np\n"
        "from essa_jax import distributed as D\n"
        "info = D.initialize(timeout_s=60, heartbeat_timeout_s=4)\n"
        "from jax.experimental.multihost_utils import process_allgather as gather\n"
        "print('first', gather(np.ones(2), tiled=True).tolist(), flush=True)\n"
        "if info.process_id == 1: os.kill(os.getpid(), signal.SIGKILL)\n"
        "time.sleep(1)\n"
        "print('second', gather(np.ones(2), tiled=True).tolist(), flush=True)\n"
    )
    procs = []
    try:
        for i in range(2):
            env = _clean_env(
                JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                JAX_NUM_PROCESSES="2",
                JAX_PROCESS_ID=str(i),
                XLA_FLAGS="--xla_force_host_platform_device_count=1",
            )
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", code],
                    env=env,
                    cwd=ROOT,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    start_new_session=True,
                )
            )
        out0, _ = procs[0].communicate(timeout=120)
        procs[1].wait(timeout=30)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    assert procs[1].returncode == -9
    assert "first [1.0, 1.0, 1.0, 1.0]" in out0 and "second" not in out0
    assert procs[0].returncode != 0
    assert "heartbeat" in out0.lower() or "task died" in out0.lower(), out0[-2000:]
