"""Counters of reward calls, failures and timeouts that training loops log."""

from __future__ import annotations

import collections
import dataclasses
import threading


@dataclasses.dataclass
class RewardStats:
    """Mutable, thread-safe counters for one reward (host-side bookkeeping, not a jax pytree).

    `calls`: completions scored; `failures`: completions scored 0.0 because the reward raised or
    returned a non-finite value (or not one value per completion); `nonfinite`: those of
    `failures` that were a NaN / inf value; `timeouts`: completions scored 0.0 because the reward
    ran past its bound (not included in `failures`); `errors`: exception type name -> count;
    `last_error`: the most recent message, for a log line.
    """

    calls: int = 0
    failures: int = 0
    nonfinite: int = 0
    timeouts: int = 0
    errors: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    last_error: str = ""
    _lock: threading.Lock = dataclasses.field(
        default_factory=threading.Lock, repr=False, compare=False
    )

    def record_calls(self, n: int) -> None:
        with self._lock:
            self.calls += n

    def record_failure(self, error: BaseException | str) -> None:
        with self._lock:
            self.failures += 1
            name = error if isinstance(error, str) else type(error).__name__
            self.errors[name] += 1
            self.last_error = f"{name}: {error}" if not isinstance(error, str) else error

    def record_nonfinite(self, value: float) -> None:
        """A completion the reward scored NaN / inf: a failure (scored 0.0) of its own kind."""
        self.record_failure(f"non-finite reward {value}")
        with self._lock:
            self.nonfinite += 1

    def counts(self) -> dict[str, int]:
        """The counters as ints: calls, failures (raised, non-finite or wrong output), nonfinite,
        raised (= failures - nonfinite) and timeouts; what a loop logs the differences of."""
        with self._lock:
            return {
                "calls": self.calls,
                "failures": self.failures,
                "nonfinite": self.nonfinite,
                "raised": self.failures - self.nonfinite,
                "timeouts": self.timeouts,
            }

    def record_timeout(self, message: str = "") -> None:
        with self._lock:
            self.timeouts += 1
            self.errors["timeout"] += 1
            self.last_error = f"timeout: {message}"

    def reset(self) -> None:
        with self._lock:
            self.calls = self.failures = self.nonfinite = self.timeouts = 0
            self.errors = collections.Counter()
            self.last_error = ""

    def as_dict(self, prefix: str = "") -> dict[str, float]:
        """Flat numbers for a metrics logger: calls, failures, nonfinite, timeouts, failure_rate."""
        with self._lock:
            bad = self.failures + self.timeouts
            return {
                f"{prefix}calls": float(self.calls),
                f"{prefix}failures": float(self.failures),
                f"{prefix}nonfinite": float(self.nonfinite),
                f"{prefix}timeouts": float(self.timeouts),
                f"{prefix}failure_rate": bad / self.calls if self.calls else 0.0,
            }
