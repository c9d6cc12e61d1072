"""essa_jax.preemption's bound: a signal is seen while the main thread waits inside native code,
and a stop that cannot finish within `grace_seconds` (or a second signal) exits at once with one
line and 128 + the signal (issue #31). The graceful stop with a checkpoint runs through the
command line in tests/test_run_faults.py."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The main thread blocks in one native call (a sleep stands in for a compiled XLA step), so no
# Python-level handler could run before it returns.
SCRIPT = """
import os, signal, sys, time
from essa_jax.preemption import PreemptionGuard

guard = PreemptionGuard(grace_seconds={grace})
guard.install()
guard.last_checkpoint = 4
print("ready", flush=True)
time.sleep(30)
print("step ended", guard.signum, flush=True)
"""


def _start(grace: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT.format(grace=grace)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("signals", [1, 2])
def test_stop_past_the_grace_period_or_on_a_second_signal_exits_at_once(signals):
    grace = 1.0 if signals == 1 else 60.0  # with 2 signals the second must not wait for it
    p = _start(grace)
    assert p.stdout.readline().strip() == "ready"
    t0 = time.monotonic()
    for _ in range(signals):
        p.send_signal(15)
        time.sleep(0.2)
    out, err = p.communicate(timeout=20)
    waited = time.monotonic() - t0
    assert p.returncode == 143, (p.returncode, err)
    assert "step ended" not in out  # the 30 s native wait was cut short
    assert waited < 10, waited
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    why = "checkpoint.preempt_seconds=1s elapsed" if signals == 1 else "a second signal"
    assert f"SIGTERM received and {why}" in lines[0]
    assert "resumes from its last checkpoint (step 4) (exit status 143)" in lines[0]
