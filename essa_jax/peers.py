"""A multi-process run that loses a process: every survivor stops within a bounded time, in one
line naming the process that disappeared and the last step it completed, with its checkpoints as
they were (issue #44).

Without this, JAX's runtime decides how a survivor ends: a peer killed mid-collective leaves the
others blocked in Gloo until its ~1 minute timeout and then a C++ abort (a SIGABRT and a page of
log), and a dead coordinator aborts them at once without a word. Python cannot catch either, so
two pieces share the work:

- `PeerWatch` (inside the run): a thread that heart-beats through the coordination service's
  key-value store every `interval_s` and reads every peer's beat. A peer whose beat has not changed
  for `timeout_s`, or a coordination service that stops answering (the coordinator, process 0, is
  gone), ends this process with `PEER_LOST_EXIT_CODE` and the line. A process that finished its run
  marks its beat "done" (`finish`), so that the ones still writing results do not count it lost.
  The loop reports its progress (`note_progress`: the step completed and the last checkpoint).
- `supervise` (around the run): the command re-runs itself as a child (the worker) and waits for
  it, forwarding SIGTERM / SIGINT (the worker stops at a step boundary with a checkpoint, as a
  single process does). When the worker is killed by a signal nobody sent it (the runtime's
  abort), the supervisor says what `PeerWatch` would have: which process disappeared (the other
  one of two; process 0 when the coordinator no longer accepts connections; else the peer whose
  beat was stalest) and the last step, read from the progress file the worker keeps.

Exit status 69 (EX_UNAVAILABLE) either way: restart every process with the same command and the
run resumes from its latest checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

PEER_LOST_EXIT_CODE = 69  # EX_UNAVAILABLE: a process of the run is gone; restart them all
ENV_WORKER = "ESSA_JAX_WORKER_PROGRESS"  # set in the worker: its progress file
DEFAULT_PEER_TIMEOUT_S = 30.0
_BEAT_PREFIX = "essa_jax/beat/"
_DONE = "done"

_WATCH: PeerWatch | None = None


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class Progress:
    """The last step a run completed and its last checkpoint, kept in a small file (the
    supervisor reads it after the worker died) and in memory (`PeerWatch`'s line)."""

    def __init__(self, path: str | None):
        self.path = path
        self.step: int | None = None
        self.checkpoint: int | None = None
        self.beats: dict[int, float] = {}  # peer -> seconds since its beat last changed

    def write(self) -> None:
        if not self.path:
            return
        record = {"step": self.step, "checkpoint": self.checkpoint, "stale_s": self.beats}
        tmp = f"{self.path}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(record, f)
            os.replace(tmp, self.path)
        except OSError:
            pass  # a lost progress record costs the line its step, never the run

    @staticmethod
    def read(path: str) -> dict[str, Any]:
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}


def describe_progress(step: int | None, checkpoint: int | None) -> str:
    """ "after step 7 (its last checkpoint, step 6, is kept)" or the start's equivalent."""
    done = f"after step {step}" if step else "before its first step"
    ckpt = (
        f"its last checkpoint, step {checkpoint}, is kept"
        if checkpoint is not None
        else "no checkpoint was written yet"
    )
    return f"{done} ({ckpt})"


def lost_line(lost: str, why: str, me: int, n: int, step: Any, checkpoint: Any) -> str:
    """The one line of a survivor."""
    return (
        f"error: {lost} of {n} disappeared ({why}); process {me} stopped "
        f"{describe_progress(step, checkpoint)}: restart every process with the same command to "
        f"resume from the latest checkpoint (exit status {PEER_LOST_EXIT_CODE})"
    )


class PeerWatch:
    """Heart-beats of every process through the coordination service (see the module doc)."""

    def __init__(
        self,
        client: Any,
        process_id: int,
        num_processes: int,
        *,
        timeout_s: float = DEFAULT_PEER_TIMEOUT_S,
        interval_s: float = 1.0,
        progress_path: str | None = None,
        exit_fn: Any = os._exit,
    ):
        self.client, self.me, self.n = client, int(process_id), int(num_processes)
        self.timeout_s, self.interval_s = float(timeout_s), float(interval_s)
        self.progress = Progress(progress_path)
        self._exit = exit_fn
        self._stop = threading.Event()
        self._last_round = time.monotonic()
        self._seen: dict[int, tuple[str, float]] = {}  # peer -> (beat, when it last changed)
        self._beat = 0

    def start(self) -> PeerWatch:
        now = time.monotonic()
        self._seen = {p: ("", now) for p in range(self.n) if p != self.me}
        for target in (self._run, self._watch_rounds):
            threading.Thread(target=target, daemon=True, name="peer-watch").start()
        return self

    def note_progress(self, step: int, checkpoint: int | None) -> None:
        self.progress.step, self.progress.checkpoint = int(step), checkpoint
        self.progress.write()

    def finish(self, status: int = 0) -> None:
        """This process's run returned with exit `status`: done (0, or a signal's agreed stop,
        which every process makes at the same step), so that peers still working do not count it
        lost; any other status is published too, and a peer still running after a grace period
        stops naming it (a user's error on one host only would otherwise leave the others
        blocked in a collective until the runtime aborts them)."""
        self._stop.set()
        value = _DONE if status in (0, 130, 143) else f"exit {status}"
        try:
            self.client.key_value_set(f"{_BEAT_PREFIX}{self.me}", value, allow_overwrite=True)
        except Exception:  # noqa: BLE001 - the coordinator may have finished first
            pass

    def await_loss(self) -> None:
        """Wait up to `timeout_s` and a few beats for this watch to find a lost peer (module
        function `await_loss`); when it does, `_lost` is exiting the process: never return."""
        self._stop.wait(self.timeout_s + 3 * self.interval_s)
        if self._stop.is_set():
            time.sleep(10)  # _lost is exiting this process; a finish() would have cleared _WATCH

    def _lost(self, lost: str, why: str) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        p = self.progress
        line = lost_line(lost, why, self.me, self.n, p.step, p.checkpoint)
        sys.stdout.flush()
        print(line, file=sys.stderr, flush=True)
        self._exit(PEER_LOST_EXIT_CODE)

    def _round(self) -> None:
        self._beat += 1
        self.client.key_value_set(f"{_BEAT_PREFIX}{self.me}", str(self._beat), allow_overwrite=True)
        beats = dict(self.client.key_value_dir_get(_BEAT_PREFIX))
        now = time.monotonic()
        # A peer that exited with an error gets a grace period: every process may be failing
        # the same way, each about to leave with its own line.
        grace = min(10.0, self.timeout_s)
        for peer, (old, since) in self._seen.items():
            value = beats.get(f"{_BEAT_PREFIX}{peer}", "")
            if value != old:
                self._seen[peer] = (value, now)
            elif old.startswith("exit ") and now - since > grace:
                self._lost(f"process {peer}", f"it stopped with exit status {old[5:]}")
                return
            elif old != _DONE and not old.startswith("exit ") and now - since > self.timeout_s:
                never = "never heart-beat" if not old else "no heartbeat"
                self._lost(f"process {peer}", f"{never} for {now - since:.0f} s")
                return
        self.progress.beats = {p: round(now - t, 1) for p, (v, t) in self._seen.items()}
        self.progress.write()  # the supervisor's record if the runtime aborts this process
        self._last_round = now

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._round()
            except Exception as e:  # noqa: BLE001 - the service is gone or broken
                if self._stop.is_set():
                    return
                first = (str(e).splitlines() or [type(e).__name__])[0][:160]
                who = "process 0 (the coordinator)" if self.me != 0 else "the coordination service"
                self._lost(who, f"the coordination service failed: {first}")
                return

    def _watch_rounds(self) -> None:
        # A key-value call to a coordinator that died mid-call may block: bound it here.
        while not self._stop.wait(self.interval_s):
            quiet = time.monotonic() - self._last_round
            if quiet > self.timeout_s + self.interval_s:
                who = "process 0 (the coordinator)" if self.me != 0 else "the coordination service"
                self._lost(who, f"the coordination service has not answered for {quiet:.0f} s")
                return


def start_watch(timeout_s: float = DEFAULT_PEER_TIMEOUT_S) -> PeerWatch | None:
    """Start this process's `PeerWatch` (after `jax.distributed` is initialised; None for one
    process). Its progress file is the supervisor's (`ENV_WORKER`) when there is one."""
    global _WATCH
    import jax
    from jax._src import distributed as _dist

    client = _dist.global_state.client
    if jax.process_count() == 1 or client is None:
        return None
    _WATCH = PeerWatch(
        client,
        jax.process_index(),
        jax.process_count(),
        timeout_s=timeout_s,
        progress_path=os.environ.get(ENV_WORKER) or None,
    ).start()
    return _WATCH


def note_progress(step: int, checkpoint: int | None) -> None:
    """The run completed `step`; its last checkpoint is `checkpoint` (a no-op without a watch)."""
    if _WATCH is not None:
        _WATCH.note_progress(step, checkpoint)


def await_loss() -> None:
    """After an unexpected exception with several processes: give the watch the time it needs
    (`timeout_s` and a beat) to tell whether a peer was lost. A collective whose peer died
    raises at once (Gloo: the connection closed) in whatever the main thread was doing, e.g. a
    checkpoint's barrier; when the watch confirms the loss it ends the process with its one line
    (and never returns); otherwise this returns and the exception goes on as the bug it is."""
    if _WATCH is not None:
        _WATCH.await_loss()


def finish_watch(status: int = 0) -> None:
    """This process's run returned `status`: stop heart-beating (`PeerWatch.finish`; a no-op
    without a watch)."""
    global _WATCH
    if _WATCH is not None:
        _WATCH.finish(status)
        _WATCH = None


# -- the supervisor --------------------------------------------------------------------------


def needs_supervisor(num_processes: int | None) -> bool:
    """Whether this command should run its work in a supervised child: a run of several
    processes, not already the worker."""
    return bool(num_processes and num_processes > 1) and not os.environ.get(ENV_WORKER)


def _coordinator_reachable(address: str | None, timeout_s: float = 2.0) -> bool | None:
    if not address or ":" not in address:
        return None
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def _who_was_lost(me: int, n: int, coordinator: str | None, stale: dict) -> str:
    others = [p for p in range(n) if p != me]
    if len(others) == 1:
        return "process 0 (the coordinator)" if others[0] == 0 else f"process {others[0]}"
    if me != 0 and _coordinator_reachable(coordinator) is False:
        return "process 0 (the coordinator)"
    if stale:
        peer, age = max(((int(p), float(a)) for p, a in stale.items()), key=lambda x: x[1])
        return f"process {peer} (the stalest heartbeat, {age:.0f} s)"
    return "one of processes " + ", ".join(map(str, others))


def _set_parent_death_signal() -> None:
    """In the worker (preexec): die with the supervisor (Linux), so that killing a supervisor
    never leaves its worker running on."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


# A line of the runtime's C++ log (glog / absl: "E1207 12:45:32.381945 ..."), a check failure's
# stack, or what the interpreter prints when it is aborted: held back by the supervisor.
_RUNTIME_LOG = re.compile(r"^([IWEF]\d{4} \d\d:\d\d:\d\d|\*\*\* |    @ |Fatal Python error)")


# Lines that continue a runtime log line: its message's further lines, a stack, the thread dump
# of the interpreter's fault handler.
_CONTINUED = (
    " ", "\t", "\n", ":", "*", "Additional GRPC", "Thread 0x", "Current thread",
    "Extension modules",
)  # fmt: skip


class _StderrRelay:
    """The worker's stderr, passed on line by line, except the runtime's log lines and the lines
    that continue them (`_CONTINUED`): those wait, and pass on in order when a line of the
    program's own comes or the worker exits normally; after an abort they are kept in a file, so
    that an aborted worker's survivor says its one line and nothing else."""

    def __init__(self, stream: Any):
        self.held: list[bytes] = []
        self._out = sys.stderr.buffer if hasattr(sys.stderr, "buffer") else None
        self._in_log = False
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream: Any) -> None:
        for raw in iter(stream.readline, b""):
            text = raw.decode(errors="replace")
            if _RUNTIME_LOG.match(text) or (self._in_log and text.startswith(_CONTINUED)):
                self._in_log = True
                self.held.append(raw)
                continue
            self._in_log = False
            self.flush()
            self._write(raw)

    def _write(self, raw: bytes) -> None:
        if self._out is not None:
            self._out.write(raw)
            self._out.flush()
        else:
            sys.stderr.write(raw.decode(errors="replace"))
            sys.stderr.flush()

    def join(self) -> None:
        self._thread.join(timeout=10)

    def flush(self) -> None:
        held, self.held = self.held, []
        for raw in held:
            self._write(raw)

    def drop(self, path: str) -> str | None:
        held, self.held = self.held, []
        if not held:
            return None
        try:
            with open(path, "wb") as f:
                f.writelines(held)
            return path
        except OSError:
            return None


def supervise(process_id: int, num_processes: int, coordinator: str | None) -> int:
    """Run this very command (`sys.orig_argv`) as the worker and wait for it; returns the exit
    status to leave with (see the module doc). SIGTERM / SIGINT are forwarded once each; the
    worker has its own process group, so a terminal's Ctrl-C reaches it once, through here."""
    fd, progress = tempfile.mkstemp(prefix="essa_jax_progress_", suffix=".json")
    os.close(fd)
    env = {**os.environ, ENV_WORKER: progress}
    sent: set[int] = set()
    children: list[subprocess.Popen] = []

    def forward(signum, _frame):
        # Installed before the worker starts: a signal in between is sent once it exists.
        sent.add(signum)
        for c in children:
            try:
                c.send_signal(signum)
            except ProcessLookupError:
                pass

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, forward)
    try:
        child = subprocess.Popen(
            [sys.executable, *sys.orig_argv[1:]],
            env=env,
            stderr=subprocess.PIPE,
            process_group=0,
            preexec_fn=_set_parent_death_signal,
        )
        children.append(child)
        for signum in sorted(sent):
            child.send_signal(signum)
        relay = _StderrRelay(child.stderr)
        while True:
            try:
                rc = child.wait()
                break
            except InterruptedError:
                continue
        relay.join()
        if rc >= 0:
            relay.flush()
            return rc
        # The runtime's own log of its abort (C++ log lines, a stack trace): kept in a file.
        held = relay.drop(f"{progress}.stderr")
        signum = -rc
        record = Progress.read(progress)
        step, ckpt = record.get("step"), record.get("checkpoint")
        if signum in sent:
            # Stopped by the signal it was sent before its handler was in place (start-up).
            print(
                f"stopped: {_signal_name(signum)} received; process {process_id} stopped "
                f"{describe_progress(step, ckpt)}",
                file=sys.stderr,
                flush=True,
            )
            return 128 + signum
        if signum not in (signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS):
            # Killed from outside (the kernel's OOM killer, a user's SIGKILL of the worker).
            print(
                f"error: process {process_id} of {num_processes} was killed by "
                f"{_signal_name(signum)} (not a signal sent to this command: out of memory?) "
                f"{describe_progress(step, ckpt)}: restart every process with the same command "
                f"to resume (exit status {128 + signum})",
                file=sys.stderr,
                flush=True,
            )
            return 128 + signum
        lost = _who_was_lost(process_id, num_processes, coordinator, record.get("stale_s", {}))
        why = f"this process's JAX runtime aborted ({_signal_name(signum)}) when it lost its peer"
        if held:
            why += f"; its log: {held}"
        print(
            lost_line(lost, why, process_id, num_processes, step, ckpt),
            file=sys.stderr,
            flush=True,
        )
        return PEER_LOST_EXIT_CODE
    finally:
        for path in (progress, f"{progress}.tmp"):  # the .stderr log, if any, stays
            try:
                os.unlink(path)
            except OSError:
                pass
