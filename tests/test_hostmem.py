"""essa_jax.hostmem: glibc keeps the memory a process frees, so the next call does not page-fault
it back in (what XLA's CPU buffers hit on every call)."""

import os
import subprocess
import sys

import pytest

from essa_jax import hostmem

glibc = pytest.mark.skipif(
    __import__("platform").libc_ver()[0] != "glibc", reason="glibc tunables only"
)


@glibc
def test_env_adds_the_tunables_and_keeps_what_the_user_set():
    env = hostmem.retained_malloc_env({"PATH": "/bin"})
    assert env["PATH"] == "/bin" and hostmem.retained_in_effect(env)
    assert hostmem.retained_malloc_env(env) is None  # already in effect: no second restart
    user = hostmem.retained_malloc_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=4:x.y=1"})
    parts = user["GLIBC_TUNABLES"].split(":")
    assert parts[:2] == ["glibc.malloc.arena_max=4", "x.y=1"]  # the user's values stay
    assert "glibc.malloc.mmap_max=0" in parts and not hostmem.retained_in_effect(user)
    assert hostmem.retained_malloc_env({"ESSA_JAX_MALLOC": "system"}) is None
    assert not hostmem.retained_in_effect({})


# malloc, touch and free 256 MB twice (as XLA's CPU runtime does with a call's buffers); print
# the minor page faults of the second round.
_FAULTS = """
import ctypes, sys
from essa_jax import hostmem
if sys.argv[1] == "retained":
    hostmem.reexec_with_retained_malloc()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def faults():
    return int(open("/proc/self/stat").read().split()[9])
def round_trip():
    p = libc.malloc(1 << 28)
    ctypes.memset(p, 1, 1 << 28)
    libc.free(p)
round_trip()
f0 = faults()
round_trip()
print(faults() - f0)
"""


@glibc
def test_retained_malloc_stops_refaulting_freed_memory():
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", hostmem.OPT_OUT)}

    def second_round_faults(mode: str) -> int:
        out = subprocess.run(
            [sys.executable, "-c", _FAULTS, mode], env=env, capture_output=True, text=True,
            check=True, timeout=120,
        ).stdout  # fmt: skip
        return int(out.split()[-1])

    default, retained = second_round_faults("default"), second_round_faults("retained")
    pages = (1 << 28) // 4096
    assert default > pages // 2  # glibc unmapped the block: it faults back in
    assert retained < pages // 20  # kept: the second round reuses it
