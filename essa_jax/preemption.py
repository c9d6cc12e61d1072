"""Graceful preemption: SIGTERM / SIGINT stop a run at a step boundary with a checkpoint.

A preempted cloud VM, Slurm or Kubernetes send SIGTERM first (SIGINT: Ctrl-C). `PreemptionGuard`
turns either into a request: the run finishes the step in progress, writes a checkpoint of it and
raises `Preempted`, which the command line reports in one line with exit status 128 + the signal
number (143 for SIGTERM, 130 for SIGINT); rerunning the same command resumes exactly from it.

Bounded time: the first signal starts a watchdog of `grace_seconds` (`checkpoint.preempt_seconds`).
If the step and the checkpoint are not done by then, or a second signal arrives, the process
exits at once with one line and the same status; the run resumes from its previous checkpoint
(the killed write's ``*.orbax-checkpoint-tmp-*`` is removed at the next start).

Why a watcher thread: a Python signal handler runs only when the main thread executes bytecode,
not while it waits in a compiled XLA program. The C-level handler that Python installs writes the
signal number to the wakeup fd (`signal.set_wakeup_fd`) at once, in whichever thread the kernel
picked; the watcher thread reads it there, records the request and keeps the deadline.

Several processes: each may receive the signal at a different step. `stop_requested` is a
collective at every step boundary (the max of every process's pending signal, one int gathered
from each), so all processes agree to stop after the same step and write the same checkpoint
(no process writes a checkpoint the others lack). JAX's own preemption sync manager
(`multihost_utils.reached_preemption_sync_point`) needs the coordination service's SIGTERM
notifier, which this guard's handler replaces; the gather is the equivalent agreed-step protocol.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preempted(Exception):
    """The run stopped on a signal at a step boundary; `exit_status` is 128 + the signal."""

    def __init__(self, signum: int, step: int, checkpoint: str):
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        super().__init__(
            f"{signal.Signals(signum).name} received: stopped after step {step} with checkpoint "
            f"{checkpoint}; run the same command to resume (exit status {128 + signum})"
        )

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


class PreemptionGuard:
    """SIGTERM / SIGINT handling of one run (`install`, `stop_requested`, `uninstall`).

    `last_checkpoint` (a step) is what the watchdog names when it must exit without a new one.
    """

    def __init__(self, grace_seconds: float):
        self.grace_seconds = float(grace_seconds)
        self.signum = 0  # the first signal received (0 = none)
        self.last_checkpoint: int | None = None
        self._previous: dict[int, Any] = {}
        self._wakeup: tuple[int, int] | None = None
        self._old_wakeup = -1
        self._timer: threading.Timer | None = None
        self._installed = False

    def install(self) -> None:
        """Take over SIGTERM and SIGINT (main thread only; a no-op elsewhere)."""
        if threading.current_thread() is not threading.main_thread():
            return
        r, w = os.pipe()
        os.set_blocking(w, False)
        self._wakeup = (r, w)
        self._old_wakeup = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        for s in SIGNALS:
            # The Python-level handler does nothing: the watcher thread has the signal already.
            self._previous[s] = signal.signal(s, lambda *_: None)
        threading.Thread(target=self._watch, args=(r,), daemon=True, name="preemption").start()
        self._installed = True

    def uninstall(self) -> None:
        """Give the signals back to their previous handlers."""
        if not self._installed:
            return
        for s, h in self._previous.items():
            signal.signal(s, h)
        signal.set_wakeup_fd(self._old_wakeup)
        if self._timer is not None:
            self._timer.cancel()
        os.close(self._wakeup[1])  # the watcher's read ends with EOF
        self._installed = False

    def _watch(self, fd: int) -> None:
        while True:
            try:
                data = os.read(fd, 64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum not in SIGNALS:
                    continue
                if self.signum:
                    self._exit(signum, "a second signal")
                self.signum = signum
                self._timer = threading.Timer(
                    self.grace_seconds,
                    self._exit,
                    args=(signum, f"checkpoint.preempt_seconds={self.grace_seconds:g}s elapsed"),
                )
                self._timer.daemon = True
                self._timer.start()

    def _exit(self, signum: int, why: str) -> None:
        last = (
            f"its last checkpoint (step {self.last_checkpoint})"
            if self.last_checkpoint is not None
            else "the start (no checkpoint was written)"
        )
        name = signal.Signals(signum).name
        print(
            f"error: {name} received and {why} before the current step ended with a checkpoint: "
            f"stopped without one; the run resumes from {last} (exit status {128 + signum})",
            file=sys.stderr,
            flush=True,
        )
        os._exit(128 + signum)

    def stop_requested(self) -> int:
        """The signal to stop on (0 = go on), agreed by every process: call it at the same step
        boundary on all of them (a collective when there are several)."""
        import jax

        if jax.process_count() == 1:
            return self.signum
        import numpy as np
        from jax.experimental import multihost_utils

        every = multihost_utils.process_allgather(np.asarray(self.signum, np.int32))
        return int(np.max(every))
