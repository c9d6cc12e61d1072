"""A wall-clock bound on a Python call that works in the main thread and in worker threads.

math-verify's own timeout uses `signal.alarm`, which only works in the main thread (and raises a
ValueError elsewhere). `call_with_timeout` keeps the signal approach in the main thread (so a hung
sympy computation is really interrupted), with a stack of deadlines so nested bounds compose, and in
any other thread runs the call in a daemon helper thread and stops waiting at the deadline.

Limits (documented, not hidden):
- Main thread: the alarm interrupts Python bytecode; a single long C call (e.g. a huge integer
  power) only notices it when the C call returns.
- Other threads: Python cannot kill a thread, so a timed-out call is *abandoned*: it keeps running
  in its daemon thread until it finishes (never blocking interpreter exit); `abandoned_threads()`
  counts them so a loop can log it.
"""

from __future__ import annotations

import itertools
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class RewardTimeoutError(TimeoutError):
    """A bounded call ran past its deadline."""


class _Alarm(BaseException):
    """Raised by the SIGALRM handler. A BaseException so that library code that catches
    `Exception` broadly (math-verify, sympy) does not swallow the interruption."""

    def __init__(self, token: int):
        super().__init__(token)
        self.token = token


_tokens = itertools.count()
# Main-thread deadline stack: entries [deadline, token, fired]. Only touched from the main thread.
_stack: list[list[Any]] = []
_abandoned = 0
_abandoned_lock = threading.Lock()


def abandoned_threads() -> int:
    """How many timed-out calls were left running in helper threads (non-main-thread path)."""
    return _abandoned


def _handler(signum, frame):
    now = time.monotonic()
    for entry in _stack:  # outermost first: the outer deadline wins if several passed
        if not entry[2] and entry[0] <= now:
            entry[2] = True
            raise _Alarm(entry[1])
    _arm()


def _arm() -> None:
    pending = [e[0] for e in _stack if not e[2]]
    if not pending:
        signal.setitimer(signal.ITIMER_REAL, 0)
        return
    signal.setitimer(signal.ITIMER_REAL, max(min(pending) - time.monotonic(), 1e-4))


def _main_thread_call(fn: Callable[..., T], timeout_s: float, args, kwargs) -> T:
    token = next(_tokens)
    entry = [time.monotonic() + timeout_s, token, False]
    outermost = not _stack
    if outermost:
        previous = signal.signal(signal.SIGALRM, _handler)
    _stack.append(entry)
    _arm()
    try:
        return fn(*args, **kwargs)
    except _Alarm as alarm:
        if alarm.token != token:
            raise
        raise RewardTimeoutError(f"call exceeded its {timeout_s:g} s bound") from None
    finally:
        entry[2] = True  # first: an alarm arriving during clean-up must not raise for this entry
        _stack.remove(entry)
        if outermost:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        else:
            _arm()


def _thread_call(fn: Callable[..., T], timeout_s: float, args, kwargs) -> T:
    global _abandoned
    result: list[Any] = []
    error: list[BaseException] = []

    def target():
        try:
            result.append(fn(*args, **kwargs))
        except BaseException as e:  # re-raised in the caller's thread
            error.append(e)

    worker = threading.Thread(target=target, daemon=True, name="essa-bounded-call")
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        with _abandoned_lock:
            _abandoned += 1
        raise RewardTimeoutError(f"call exceeded its {timeout_s:g} s bound (thread abandoned)")
    if error:
        raise error[0]
    return result[0]


def call_with_timeout(fn: Callable[..., T], timeout_s: float | None, *args, **kwargs) -> T:
    """`fn(*args, **kwargs)`, raising `RewardTimeoutError` once `timeout_s` seconds have passed.

    `timeout_s` None or <= 0 calls `fn` unbounded. Safe to nest (inner and outer bounds both hold)
    and to call from any thread (see the module docstring for what happens to a timed-out call).
    """
    if timeout_s is None or timeout_s <= 0:
        return fn(*args, **kwargs)
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
        return _main_thread_call(fn, float(timeout_s), args, kwargs)
    return _thread_call(fn, float(timeout_s), args, kwargs)
