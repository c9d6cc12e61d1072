"""A small name -> function registry, the one behind the advantage estimators (`rl.advantage`)
and the advantage weightings (`rl.weighting`), so a user extends the GRPO step by registering a
function instead of editing the trainer (Tunix style: estimators by name)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Registry:
    """Functions by name, for one `kind` of thing (named in error messages)."""

    def __init__(self, kind: str):
        self.kind = kind
        self._fns: dict[str, Callable[..., Any]] = {}

    def register(self, name: str, fn: Callable[..., Any] | None = None, *, overwrite: bool = False):
        """Register `fn` as `name` (or, without `fn`, return a decorator that does); returns `fn`.
        Re-registering a name raises unless `overwrite=True`."""

        def add(f: Callable[..., Any]) -> Callable[..., Any]:
            if not isinstance(name, str) or not name:
                raise ValueError(f"a {self.kind} name must be a non-empty string, got {name!r}")
            if not callable(f):
                raise TypeError(f"{self.kind} {name!r} must be callable, got {f!r}")
            if name in self._fns and not overwrite:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._fns[name] = f
            return f

        return add if fn is None else add(fn)

    def get(self, name: str) -> Callable[..., Any]:
        """The function registered as `name`; ValueError naming the registered ones if none."""
        if name not in self._fns:
            raise ValueError(f"unknown {self.kind} {name!r}; registered: {self.names()}")
        return self._fns[name]

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._fns)
