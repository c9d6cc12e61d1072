"""A multi-process run that loses a process (issue #44): every survivor ends within a bounded
time in one line naming the process that disappeared and the last step it completed, exit status
69, its checkpoints intact (`essa_jax.peers`).

The heartbeat watch and the supervisor are checked on their own first (a fake coordination
client; a worker that aborts as JAX's runtime does), then on two real processes of a tiny ESSA
run: process 1 killed (process 0 must name it), then the coordinator killed (process 1 must)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from procs import worker_env

from essa_jax import peers
from essa_jax.checkpointing import complete_steps

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments"))
from launch_local import free_port, process_env  # noqa: E402

CONFIG = Path(__file__).resolve().parent / "tiny_essa_config.py"


class FakeClient:
    """The two key-value calls PeerWatch makes; `frozen` peers stop beating."""

    def __init__(self, n):
        self.kv = {}
        self.n = n
        self.frozen: set[int] = set()
        self.broken = False
        self.beats = 0

    def key_value_set(self, key, value, allow_overwrite=False):
        if self.broken:
            raise RuntimeError("UNAVAILABLE: failed to connect to all addresses")
        self.kv[key] = value

    def key_value_dir_get(self, prefix):
        if self.broken:
            raise RuntimeError("UNAVAILABLE: failed to connect to all addresses")
        self.beats += 1
        for p in range(self.n):  # every live peer beats once per read
            key = f"{prefix}{p}"
            if p not in self.frozen and self.kv.get(key) != "done":
                self.kv[key] = str(self.beats)
        return [(k, v) for k, v in self.kv.items() if k.startswith(prefix)]


def _watch(client, me=0, timeout=0.3):
    exits = []
    w = peers.PeerWatch(
        client, me, client.n, timeout_s=timeout, interval_s=0.05, exit_fn=exits.append
    )
    return w, exits


def _wait(cond, seconds=5.0):
    end = time.monotonic() + seconds
    while not cond() and time.monotonic() < end:
        time.sleep(0.02)
    return cond()


def test_a_peer_whose_beat_stops_is_named_with_the_last_step(capsys):
    client = FakeClient(3)
    watch, exits = _watch(client)
    watch.start()
    watch.note_progress(7, 6)
    time.sleep(0.5)
    assert exits == []  # every peer beats: nothing happens however long it runs
    client.frozen.add(2)
    assert _wait(lambda: exits == [peers.PEER_LOST_EXIT_CODE])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("error: process 2 of 3 disappeared (no heartbeat for")
    assert "process 0 stopped after step 7 (its last checkpoint, step 6, is kept)" in line
    assert line.endswith("(exit status 69)")


def test_a_finished_peer_is_not_lost_and_a_dead_coordinator_is(capsys):
    client = FakeClient(2)
    watch, exits = _watch(client, me=1)
    watch.start()
    client.kv["essa_jax/beat/0"] = "done"  # process 0 finished its run and waits at the barrier
    client.frozen.add(0)
    time.sleep(0.8)
    assert exits == []
    client.broken = True
    assert _wait(lambda: exits == [peers.PEER_LOST_EXIT_CODE])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "process 0 (the coordinator) of 2 disappeared" in line
    assert "UNAVAILABLE" in line and "before its first step" in line


def test_a_peer_that_left_with_an_error_is_named_after_a_grace_period(capsys):
    client = FakeClient(2)
    watch, exits = _watch(client, me=0)
    watch.start()
    client.frozen.add(1)
    client.kv["essa_jax/beat/1"] = "exit 2"  # its own error line says why
    assert _wait(lambda: exits == [peers.PEER_LOST_EXIT_CODE])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "process 1 of 2 disappeared (it stopped with exit status 2)" in line
    # Finishing with an agreed signal stop (143) or success publishes "done".
    watch = peers.PeerWatch(client, 1, 2, exit_fn=exits.append)
    watch.finish(143)
    assert client.kv["essa_jax/beat/1"] == "done"


SCRIPT = """
import json, os, sys, time
from essa_jax import peers

progress = os.environ.get(peers.ENV_WORKER)
if progress:
    json.dump({"step": 3, "checkpoint": 2, "stale_s": {}}, open(progress, "w"))
    mode = sys.argv[1]
    if mode == "abort":
        os.abort()  # what JAX's runtime does when a collective loses its peer
    if mode == "exit":
        sys.exit(7)
    open(sys.argv[2], "w").close()  # "wait": started (the supervisor forwards from now)
    time.sleep(60)  # until a signal
sys.exit(peers.supervise(0, 2, None))
"""


def _script(tmp_path, mode):
    path = tmp_path / "worker.py"
    path.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(peers.ENV_WORKER, None)
    return subprocess.Popen(
        [sys.executable, str(path), mode, str(tmp_path / "started")],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_the_supervisor_names_the_peer_when_the_runtime_aborts_and_passes_the_rest_on(tmp_path):
    p = _script(tmp_path, "abort")
    _, err = p.communicate(timeout=60)
    assert p.returncode == 69, err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert line.startswith("error: process 1 of 2 disappeared (this process's JAX runtime aborted")
    assert "after step 3 (its last checkpoint, step 2, is kept)" in line
    p = _script(tmp_path, "exit")
    assert p.wait(timeout=60) == 7  # the worker's own status passes through
    p = _script(tmp_path, "wait")
    assert _wait(lambda: (tmp_path / "started").exists(), 60)
    p.send_signal(signal.SIGTERM)  # forwarded: the worker ends by it
    _, err = p.communicate(timeout=60)
    assert p.returncode == 143 and "stopped: SIGTERM received" in err, err


def _start(workdir, tmp_path, port, timeout_s):
    base = worker_env(tmp_path)
    cmd = [
        sys.executable, "-m", "essa_jax.main", f"--config={CONFIG}", f"--workdir={workdir}",
        "--config.essa.generations=100000", "--config.checkpoint.every=2",
        f"--peer_timeout_s={timeout_s}",
    ]  # fmt: skip
    return [
        subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=process_env(i, 2, port, 1, base),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for i in range(2)
    ]


def _train_steps(workdir):
    path = Path(workdir) / "metrics.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [r["step"] for r in rows if r["phase"] == "train"]


@pytest.mark.multiprocess
@pytest.mark.slow  # two two-process tiny runs, each killed after a few generations
@pytest.mark.parametrize("killed", [1, 0])
def test_a_killed_process_ends_the_survivor_in_one_line_within_the_bound(killed, tmp_path):
    work, timeout_s = tmp_path / "run", 10
    procs = _start(work, tmp_path, free_port(), timeout_s)
    deadline = time.monotonic() + 400
    try:
        while not any(s >= 3 for s in _train_steps(work)):
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            assert time.monotonic() < deadline, "no step 3 in time"
            time.sleep(0.05)
        os.killpg(procs[killed].pid, signal.SIGKILL)  # the supervisor; its worker dies with it
        t_kill = time.monotonic()
        survivor = procs[1 - killed]
        _, err = survivor.communicate(timeout=timeout_s + 60)
        elapsed = time.monotonic() - t_kill
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert survivor.returncode == 69, err[-3000:]
    assert elapsed < timeout_s + 30, elapsed  # bounded: the watch's timeout and a margin
    lines = [ln for ln in err.strip().splitlines() if not re.match(r"[IWE]\d{4} ", ln)]
    assert len(lines) == 1, "\n".join(lines)[:5000]
    name = "process 0 (the coordinator)" if killed == 0 else "process 1"
    assert lines[0].startswith(f"error: {name} of 2 disappeared"), lines[0]
    step = int(lines[0].split("stopped after step ")[1].split()[0])
    assert step >= 2  # process 0 logged step 3, so every process had completed step 2
    steps = complete_steps(str(work / "checkpoints"))
    assert steps and steps[-1] <= step and f"step {steps[-1]}, is kept" in lines[0]
