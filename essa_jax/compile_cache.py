"""JAX's persistent compilation cache for runs: a resumed or repeated run loads the programs it
compiled before instead of compiling them again (start-up, issue #43).

`--compile_cache` of `python -m essa_jax.main`:
- "auto" (default): `$JAX_COMPILATION_CACHE_DIR` when set (then JAX's own settings stand, as the
  user or the test suite made them), else `$ESSA_JAX_COMPILE_CACHE` ("off" turns it off), else
  `<user cache dir>/essa_jax/jax_compile` (`$XDG_CACHE_HOME`, default `~/.cache`).
- "off": no cache.
- a folder: that folder.

Sharing: several runs (and the processes of one run) may use one folder at once. JAX writes an
entry under a name that is the hash of the program, the compiler options and the backend, so a
reader gets a whole program or none; with a size limit set (`MAX_BYTES`) it also takes a file lock
(the `filelock` package) around its least-recently-used eviction. A cache that cannot be used
(an unwritable folder, a full disk) is a warning, never a failed run: the program is compiled.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

ENV = "ESSA_JAX_COMPILE_CACHE"
JAX_ENV = "JAX_COMPILATION_CACHE_DIR"
# Programs that compile faster than this are not worth a disk read (JAX's own default is 1 s).
MIN_COMPILE_SECONDS = 1.0
# Eviction bound of the folder (least recently used first): a 7B config's programs are ~10-100
# MB each, so this holds many runs' worth, and a non-negative limit turns on JAX's file lock.
MAX_BYTES = 8 << 30


def default_dir(env: Mapping[str, str] = os.environ) -> str:
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "essa_jax", "jax_compile")


def resolve(setting: str, env: Mapping[str, str] = os.environ) -> tuple[str | None, bool]:
    """(folder or None for no cache, whether JAX's own environment settings decide it) for a
    `--compile_cache` value (module docstring). ValueError for an empty value."""
    setting = setting.strip()
    if not setting:
        raise ValueError("--compile_cache '': use auto, off or a folder")
    if setting == "off":
        return None, False
    if setting != "auto":
        return os.path.abspath(os.path.expanduser(setting)), False
    if env.get(JAX_ENV):
        return env[JAX_ENV], True
    mine = env.get(ENV, "").strip()
    if mine == "off":
        return None, False
    return (os.path.abspath(os.path.expanduser(mine)) if mine else default_dir(env)), False


def enable(setting: str = "auto", env: Mapping[str, str] = os.environ) -> str | None:
    """Point JAX's persistent cache at the folder `setting` resolves to (module docstring); returns
    it, or None when the cache is off or unusable (a one-line warning says why). Call before the
    first compilation."""
    import jax

    path, from_jax_env = resolve(setting, env)
    if from_jax_env:
        return path  # JAX read its own variables at import: the user's (or tests') choice stands
    if path is None:
        jax.config.update("jax_compilation_cache_dir", None)
        return None
    try:
        os.makedirs(path, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(13, "not writable")
    except OSError as e:
        print(
            f"warning: --compile_cache {path}: {e.strerror or e}; compiling without a cache "
            "(--compile_cache=off or a writable folder silences this)",
            file=sys.stderr,
            flush=True,
        )
        jax.config.update("jax_compilation_cache_dir", None)
        return None
    jax.config.update("jax_compilation_cache_dir", path)
    # JAX's own variables, where set, stand (JAX read them at import).
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in env:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    if "JAX_COMPILATION_CACHE_MAX_SIZE" not in env:
        jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    return path
