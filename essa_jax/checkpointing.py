"""Checkpoints that resume a run exactly, and never from a broken one.

`Checkpointer` (orbax CheckpointManager: the state pytree + a JSON item): a checkpoint at step t
holds the whole loop state after t steps (strategy or optimiser state, adapter / SVD basis, PRNG
key, data cursor, counters), plus a JSON item (metrics history, SFT results, elapsed wall-clock).
Step 0 is the state right after SFT, so a resumed run never repeats SFT.

Orbax writes a step into ``<dir>/<step>.orbax-checkpoint-tmp-<t>`` and renames it to
``<dir>/<step>`` once complete, so a run killed mid-write leaves only a tmp directory, which
`complete_steps` (and orbax's ``latest_step``) ignore. A finalised step can still be unreadable: a
disk that filled, a file truncated or deleted afterwards, a copy that stopped half-way.
`restore_latest_valid` tries the steps newest first and falls back, with a
`CheckpointFallbackWarning` naming the step and the error, to the previous one;
Damage the array reader cannot see (bytes changed inside an uncompressed chunk) is caught by a
CRC-32 of every leaf written into the step's meta (`array_digests`) and checked on restore
(`CheckpointDigestError`, a broken step like any other).
`quarantine_step` renames a broken step out of the way (``<step>.corrupt-<t>``) so the next save
of that step number does not collide with it.

Several processes: every process calls `save` / `restore` (orbax is collective) and must restore
the same step. Each holds the same state on its own devices, so the leaves are saved as global
arrays replicated over every process's devices (`essa_jax.mesh.place`; orbax writes one replica,
from process 0) and restored onto this process's first local device. Restores are reads; the
rename in `quarantine_step` is done by process 0 only, followed by a barrier.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import jax
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding, PartitionSpec

from essa_jax.mesh import make_mesh, place

T = TypeVar("T")
CHECKPOINT_DIR = "checkpoints"
_STEP_DIR = re.compile(r"^\d+$")


class WorkdirError(RuntimeError):
    """A run's workdir cannot serve the request: --resume without a checkpoint, a fresh start
    (--noresume_auto) over existing checkpoints, or no checkpoint that can be restored. A user's
    situation, not a bug: the command line reports it in one line."""


class CheckpointFallbackWarning(UserWarning):
    """A checkpoint step could not be restored; an older one is used instead."""


class CheckpointDigestError(ValueError):
    """An array read back from a checkpoint differs from the one written (its CRC-32 in the
    checkpoint's meta): bytes damaged on disk or in a copy, which the array reader cannot see in
    an uncompressed chunk. Treated as a broken step (fallback to the previous one)."""


DIGESTS = "array_digests"  # meta key: {leaf path: "crc32:<hex>"} of the state written
SHAPES = "array_shapes"  # meta key: {leaf path: [global shape]} of the state written


def _leaf_bytes(leaf: Any) -> memoryview:
    """The bytes of one state leaf on this host (typed PRNG keys as their key data)."""
    import numpy as np

    if hasattr(leaf, "dtype") and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        leaf = jax.random.key_data(leaf)
    a = np.ascontiguousarray(np.asarray(jax.device_get(leaf)))
    # A byte view: bfloat16 / int4 arrays do not export a buffer of their own dtype.
    return memoryview(a.reshape(-1).view(np.uint8)) if a.size else memoryview(b"")


def array_digests(state: Any) -> dict[str, str]:
    """`{leaf path: "crc32:<8 hex>"}` of every leaf of `state` (host bytes, C order).

    CRC-32 (zlib, ~1 GB/s on one core: ~1.5 s for a 1.6 GB full-parameter state) detects every
    burst error up to 32 bits and any random damage with probability 1 - 2^-32; it guards
    against damage, not against a forger."""
    import zlib

    flat, _ = jax.tree_util.tree_flatten_with_path(state)
    return {
        jax.tree_util.keystr(path): f"crc32:{zlib.crc32(_leaf_bytes(leaf)) & 0xFFFFFFFF:08x}"
        for path, leaf in flat
    }


def array_shapes(state: Any) -> dict[str, list[int]]:
    """`{leaf path: global shape}` of every leaf of `state`, keyed as `array_digests` is."""
    flat, _ = jax.tree_util.tree_flatten_with_path(state)
    return {jax.tree_util.keystr(p): list(getattr(leaf, "shape", ())) for p, leaf in flat}


def check_digests(state: Any, written: dict[str, str], where: str) -> None:
    """Raise CheckpointDigestError naming the first leaf of `state` whose digest differs from
    `written` (a leaf missing on either side is a mismatch too)."""
    read = array_digests(state)
    for path in sorted(set(read) | set(written)):
        if read.get(path) != written.get(path):
            raise CheckpointDigestError(
                f"array {path or '<root>'} of {where} does not match the digest written with it "
                f"(written {written.get(path, '<absent>')}, read {read.get(path, '<absent>')}): "
                "the checkpoint was damaged after it was written"
            )


def complete_steps(directory: str) -> list[int]:
    """Finalised checkpoint steps in `directory` (sub-directories named by an integer), ascending.

    Temporary (``*.orbax-checkpoint-tmp-*``) and quarantined (``*.corrupt-*``) directories are
    not steps. A missing directory has no steps.
    """
    if not os.path.isdir(directory):
        return []
    return sorted(
        int(name)
        for name in os.listdir(directory)
        if _STEP_DIR.match(name) and os.path.isdir(os.path.join(directory, name))
    )


def restore_latest_valid(
    restore: Callable[[int], T], steps: Iterable[int], *, where: str = "checkpoints"
) -> tuple[int, T, list[int]] | None:
    """`(step, restore(step), broken_steps)` for the newest step whose restore succeeds.

    Args:
      restore: reads one step (raises on a broken checkpoint).
      steps: candidate steps (any order).
      where: the directory, for the warning text.

    Returns None when no step restores (or there are none); every failure issues a
    `CheckpointFallbackWarning` and is listed in `broken_steps` (newest first).
    """
    broken: list[int] = []
    for step in sorted(set(steps), reverse=True):
        try:
            return step, restore(step), broken
        except Exception as e:  # orbax raises many types (ValueError, FileNotFoundError, ...)
            broken.append(step)
            first = str(e).splitlines()[0] if str(e) else ""
            warnings.warn(
                f"checkpoint step {step} in {where} cannot be restored ({type(e).__name__}: "
                f"{first[:300]}); falling back to the previous complete checkpoint",
                CheckpointFallbackWarning,
                stacklevel=2,
            )
    return None


def quarantine_step(directory: str, step: int) -> str | None:
    """Rename ``<directory>/<step>`` to ``<step>.corrupt-<unix time>`` (process 0; all wait).

    Returns the new path on process 0 (None elsewhere, or when the step does not exist).
    """
    new = None
    src = os.path.join(directory, str(step))
    if jax.process_index() == 0 and os.path.isdir(src):
        new = f"{src}.corrupt-{int(time.time())}"
        os.rename(src, new)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(f"quarantine_step_{step}")
    return new


# tensorstore's text of a failed file operation: `... local file "<path>" ... [os_error_code='28']`.
_TS_OS_ERROR = re.compile(r"os_error_code='(\d+)'")
_TS_PATH = re.compile(r'local file "([^"]+)"')


def os_error_in(e: BaseException) -> OSError | None:
    """The OSError behind an orbax / tensorstore failure: an OSError in `e`'s cause chain, or one
    rebuilt from tensorstore's message (errno and file); None when there is none."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno:
            return cur
        code = _TS_OS_ERROR.search(str(cur))
        if code:
            paths = _TS_PATH.findall(str(cur))
            n = int(code.group(1))
            return OSError(n, os.strerror(n), paths[-1] if paths else None)
        cur = cur.__cause__ or cur.__context__
    return None


@contextlib.contextmanager
def _stderr_kept_back():
    """Send what is written to file descriptor 2 (by any thread) to a temporary file; yields
    `release()`, which writes it back to stderr (and `release.settle()`, which waits until the
    threads stopped writing). Not released, it is dropped: the caller reports the failure in one
    line instead of the tracebacks orbax's threads print."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        buf = tempfile.TemporaryFile()
    except OSError:  # no room even for that: keep stderr as it is
        os.close(saved)

        def nothing(*_: Any) -> None:
            return None

        nothing.settle = nothing
        yield nothing
        return
    os.dup2(buf.fileno(), 2)
    released = False

    def settle(quiet_s: float = 0.3, limit_s: float = 5.0) -> None:
        """Wait until nothing was written for `quiet_s` (at most `limit_s`)."""
        deadline, size, since = time.monotonic() + limit_s, -1, time.monotonic()
        while time.monotonic() < deadline:
            now = os.fstat(buf.fileno()).st_size
            if now != size:
                size, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet_s:
                return
            time.sleep(0.05)

    def release() -> None:
        nonlocal released
        if released:
            return
        released = True
        sys.stderr.flush()
        os.dup2(saved, 2)
        buf.seek(0)
        text = buf.read()
        if text:
            os.write(2, text)

    release.settle = settle
    try:
        yield release
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        buf.close()


class Checkpointer:
    """Save / restore `(state pytree, meta dict)` pairs under `<workdir>/checkpoints/<step>`."""

    def __init__(self, workdir: str, keep: int = 2):
        directory = os.path.abspath(os.path.join(workdir, CHECKPOINT_DIR))
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
        self.directory = directory
        self._mgr = ocp.CheckpointManager(directory, options=options, item_names=("state", "meta"))

    def reload(self) -> None:
        """Re-read the step list from disk (after steps were renamed or removed)."""
        self._mgr.reload()

    def latest_step(self) -> int | None:
        return self._mgr.latest_step()

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
        """Write checkpoint `step` (blocks until it is finalised on disk).

        A write that fails for a reason a user fixes (no space, read-only, ...) raises the
        OSError of that cause, naming the file (orbax reports it inside a ValueError, from
        several threads at once: what they print meanwhile is kept back); the partial step stays
        a temporary directory, never a step."""
        # Digests of the host's state before it is placed: every process holds the same state.
        meta = {**meta, DIGESTS: array_digests(state), SHAPES: array_shapes(state)}
        if jax.process_count() > 1:
            state = place(state, make_mesh())  # replicated over every process's devices
        with _stderr_kept_back() as release:
            try:
                self._mgr.save(
                    step,
                    args=ocp.args.Composite(
                        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
                    ),
                    force=True,
                )
                self._mgr.wait_until_finished()
            except Exception as e:
                cause = os_error_in(e)
                if cause is None:
                    release()
                    raise
                release.settle()  # the other writer threads fail the same way, printing
                raise cause from e
            release()

    def restore(self, step: int, template: Any) -> tuple[Any, dict[str, Any]]:
        """State (with the structure, shapes and dtypes of `template`) and meta of `step`.

        `template` may be abstract (`jax.eval_shape` output): nothing is computed to restore.
        """
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
        multi = jax.process_count() > 1
        if multi:
            sharding = NamedSharding(make_mesh(), PartitionSpec())
            abstract = jax.tree.map(
                lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), abstract
            )
        # A broken step fails in orbax's reader threads, each printing its traceback; the caller
        # reports the failure (a CheckpointFallbackWarning, or one line when no step restores).
        with _stderr_kept_back() as release:
            try:
                out = self._mgr.restore(
                    step,
                    args=ocp.args.Composite(
                        state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
                    ),
                )
            except Exception:
                # The reads still in flight finish into orbax's event loop, which the failure
                # closed, each printing "Event loop is closed": held back until they are done.
                release.settle()
                raise
            release()
        state = out["state"]
        if multi:
            state = jax.tree.map(lambda a: a.addressable_data(0), state)
        meta = dict(out["meta"])
        meta.pop(SHAPES, None)
        written = meta.pop(DIGESTS, None)  # absent from checkpoints written before digests were
        if written is not None:
            check_digests(state, written, f"checkpoint step {step}")
        return state, meta

    def saved_shapes(self, step: int) -> dict[str, tuple[int, ...]] | None:
        """`{leaf path: global shape}` of the state saved at `step`, from the step's meta JSON
        alone (no array is read), or None when it cannot be read or predates the record (a
        broken step: the restore's fallback deals with it).

        Recorded at save time (`array_shapes`) rather than read from orbax's tree metadata,
        whose ``write_shape`` is a device shard's shape for an array sharded over a mesh, and
        rather than through an orbax reader, whose threads would outlive a failed read and print
        into the one line a broken step ends in."""
        import json

        try:
            with open(os.path.join(self.directory, str(step), "meta", "metadata")) as f:
                shapes = json.load(f)[SHAPES]
            return {str(k): tuple(int(d) for d in v) for k, v in shapes.items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def close(self) -> None:
        self._mgr.wait_until_finished()
        self._mgr.close()


def shape_differences(template: Any, saved: dict[str, tuple[int, ...]]) -> list[str]:
    """Where the state a config builds (`template`) differs from a saved step's shapes:
    `"path: saved (a, b), this config (c, d)"` (a leaf present on one side only says absent)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(template)
    mine = {jax.tree_util.keystr(p): tuple(getattr(leaf, "shape", ())) for p, leaf in flat}
    diffs = []
    for path in sorted(set(mine) | set(saved)):
        a, b = saved.get(path, "absent"), mine.get(path, "absent")
        if a != b:
            diffs.append(f"{path}: saved {a}, this config {b}")
    return diffs


def restore_checkpointer_with_fallback(
    checkpointer: Any, directory: str, template: Any, *, quarantine: bool = True
) -> tuple[int, Any, dict] | None:
    """Resume helper for `Checkpointer` (or anything with
    ``restore(step, template) -> (state, meta)``): `(step, state, meta)` of the newest readable
    step in `directory`, or None. Broken newer steps are quarantined (so the resumed run can save
    those step numbers again); a manager that caches its step list must be reloaded afterwards.
    """
    out = restore_latest_valid(
        lambda s: checkpointer.restore(s, template), complete_steps(directory), where=directory
    )
    if out is None:
        return None
    step, (state, meta), broken = out
    if quarantine:
        for s in broken:
            quarantine_step(directory, s)
    return step, state, meta
