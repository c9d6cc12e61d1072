"""How the process's host allocator (glibc malloc) treats the memory XLA's CPU backend frees.

XLA's CPU runtime allocates every call's buffers with malloc and frees them when the call ends.
By default glibc gives large freed blocks back to the kernel (per-thread arenas shrink, the heap
top is trimmed), so the next call page-faults the same memory back in, zero-filled. Measured on
the 2-core CI host (2026-12-04, SmolLM2-135M GRPO step of `make bench SECTION=grpo`, one core):
1.8 GB of minor page faults per update call and 0.5 GB per rollout, and with the three settings
below none, the update 7.8 s -> 5.5 s. They keep freed memory in the process (one arena, no
separate mapping for large blocks, no trimming), so its resident size stays at its high-water mark
instead of falling after each call: the price, for a process that would fault that memory back in
anyway. Accelerator memory is not malloc's; on a GPU / TPU host this only touches host buffers.

glibc reads its tunables once, at process start: `reexec_with_retained_malloc` (the `essa-jax`
command) restarts the process with them set, and `benchmarks/run.py` starts its sections with
them. `ESSA_JAX_MALLOC=system` keeps glibc's defaults (docs/ARCHITECTURE.md, Host memory).
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping

# glibc.malloc tunables (glibc manual, "Memory Allocation Tunables"): keep every freed block.
TUNABLES = {
    "glibc.malloc.arena_max": "1",  # one arena: per-thread arenas shrink their heaps on free
    "glibc.malloc.mmap_max": "0",  # large blocks from the heap, not mappings unmapped on free
    "glibc.malloc.trim_threshold": str(1 << 40),  # never trim the heap top
}
OPT_OUT = "ESSA_JAX_MALLOC"


def _set_tunables(environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """The (key, value) pairs of environ's GLIBC_TUNABLES, in order."""
    pairs = (t.split("=", 1) for t in environ.get("GLIBC_TUNABLES", "").split(":") if "=" in t)
    return [(k, v) for k, v in pairs]


def retained_malloc_env(environ: Mapping[str, str]) -> dict[str, str] | None:
    """`environ` with TUNABLES added to GLIBC_TUNABLES (a key the user set is kept as set), or
    None when nothing would change: already set, `ESSA_JAX_MALLOC=system`, or not glibc."""
    if environ.get(OPT_OUT, "") == "system" or platform.libc_ver()[0] != "glibc":
        return None
    current = _set_tunables(environ)
    have = {k for k, _ in current}
    missing = [(k, v) for k, v in TUNABLES.items() if k not in have]
    if not missing:
        return None
    return {**environ, "GLIBC_TUNABLES": ":".join(f"{k}={v}" for k, v in current + missing)}


def retained_in_effect(environ: Mapping[str, str]) -> bool:
    """Whether a process started with `environ` keeps freed memory: glibc with every TUNABLES
    key set to its value here."""
    if platform.libc_ver()[0] != "glibc":
        return False
    current = dict(_set_tunables(environ))
    return all(current.get(k) == v for k, v in TUNABLES.items())


def reexec_with_retained_malloc() -> None:
    """Restart this process (same interpreter and command line) with `retained_malloc_env`;
    return at once when it is already in effect or does not apply."""
    env = retained_malloc_env(os.environ)
    if env is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
