"""Two jax.distributed processes of one run given SIGTERM stop at the same step (issue #31).

The signal reaches process 1 alone (a preemption notice that reached one host first; the
strongest case: had process 0 got it at the same moment, both might have stopped alike by
chance). The processes agree at the next step boundary (`essa_jax.preemption`: every pending
signal gathered), write one checkpoint of that step together and each exits with 143 and one
stderr line naming it. Then the same two-process command resumes from it and finishes.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import worker_env

from essa_jax.checkpointing import complete_steps

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments"))
from launch_local import free_port, process_env  # noqa: E402

CONFIG = Path(__file__).resolve().parent / "tiny_essa_config.py"
GENERATIONS = 60


def _start(workdir, tmp_path, port):
    base = worker_env(tmp_path)
    cmd = [
        sys.executable, "-m", "essa_jax.main", f"--config={CONFIG}", f"--workdir={workdir}",
        f"--config.essa.generations={GENERATIONS}", "--config.checkpoint.every=0",
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


def _communicate(procs, timeout=300):
    out = []
    for p in procs:
        try:
            out.append(p.communicate(timeout=timeout))
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    os.killpg(q.pid, signal.SIGKILL)
            pytest.fail("a process did not exit in time")
    return out


def _train_steps(workdir):
    path = Path(workdir) / "metrics.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [r["step"] for r in rows if r["phase"] == "train"]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_sigterm_to_one_process_stops_both_at_one_step(tmp_path):
    work = tmp_path / "run"
    procs = _start(work, tmp_path, free_port())
    deadline = time.monotonic() + 400
    while not any(s >= 2 for s in _train_steps(work)):
        assert all(p.poll() is None for p in procs), _communicate(procs)
        assert time.monotonic() < deadline, "no step 2 in time"
        time.sleep(0.02)
    procs[1].send_signal(signal.SIGTERM)
    outs = _communicate(procs)
    steps = []
    for i, (p, (_, err)) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 143, (i, p.returncode, err[-3000:])
        # Besides jax.distributed's start-up INFO lines (absl: "I<date> ..."), exactly one line.
        lines = [ln for ln in err.strip().splitlines() if not re.match(r"I\d{4} ", ln)]
        assert len(lines) == 1 and "SIGTERM received: stopped after step" in lines[0], err[-3000:]
        steps.append(int(lines[0].split("stopped after step ")[1].split()[0]))
    k = steps[0]
    assert steps == [k, k] and 2 <= k < GENERATIONS, steps
    assert complete_steps(str(work / "checkpoints")) == [0, k]
    assert _train_steps(work) == list(range(1, k + 1))

    # The same command resumes from the agreed step on both processes and finishes.
    procs = _start(work, tmp_path, free_port())
    outs = _communicate(procs)
    for i, (p, (_, err)) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0, (i, err[-3000:])
    assert f"resuming from {work}/checkpoints/{k}" in outs[0][0]
    assert _train_steps(work) == list(range(1, GENERATIONS + 1))
