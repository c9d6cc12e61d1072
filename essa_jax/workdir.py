"""A run's workdir: one run at a time, files replaced only whole, the run's record kept.

- `WorkdirLock`: an exclusive `fcntl.flock` on ``<workdir>/run.lock`` held for the run's life
  (process 0 of a multi-process run). The kernel drops a flock when its process dies, so a lock is
  never stale; the file's text (pid, host, start time, command) outlives it, and a run that finds
  the text of a process that no longer holds the lock says that it takes it over.
- `write_text_atomic` / `replace_dir`: write beside the target, then rename over it, so a full
  disk or a kill mid-write never replaces a good file (config.json, summary.json, the adapter)
  with a partial one.
- `remove_partial_checkpoints`: orbax's ``*.orbax-checkpoint-tmp-*`` directories of a write that
  was killed, removed with a line.
- The run's record (docs/ARCHITECTURE.md, "The run's record"): `config.json` is the config of
  the run in the workdir. `config_changes` compares it with a resumed run's config: a field of
  `MAY_CHANGE` (step budget, wall-clock, evaluation cadence, checkpoint cadence, logging, memory
  knobs that leave results unchanged) is allowed and logged; any other field changes the run's
  meaning and refuses the resume, unless the user overrides it knowingly (`--allow_config_change`).
  Accepted changes are appended to ``config_changes.jsonl`` before config.json is rewritten.
- `os_error_line`: an OSError a user can fix (no space, read-only, permission) as one line.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import socket
import sys
import time
from collections.abc import Mapping
from typing import Any

from essa_jax.checkpointing import WorkdirError, os_error_in

LOCK_FILE = "run.lock"
CONFIG_FILE = "config.json"
CHANGES_FILE = "config_changes.jsonl"
PARTIAL_CHECKPOINT = ".orbax-checkpoint-tmp"

# Fields a resumed run may change: they decide when the run stops, how often it is measured and
# saved, what it logs, and how much memory a step takes, never what a step computes (the micro-batch
# and chunk sizes and remat give the same update to float summation order). Every other field of
# the config (model, method, task and reward, seeds, LoRA rank / alpha / targets, SFT, the strategy
# and its settings, GRPO's settings, sampling, the mesh, ...) changes the run's meaning. A field
# added to the schema is meaning-changing until it is listed here.
MAY_CHANGE = (
    "essa.generations",
    "grpo.steps",
    "max_wall_seconds",
    "max_cpu_seconds",
    "task.max_reward_failure_fraction",  # when a broken reward stops the run, not a step
    "essa.max_flat_generations",  # when a search that ranks nothing stops, not a step
    "eval.every",
    "eval.every_seconds",
    "eval.batch_size",
    "eval.base_model",
    "eval.pass_k_samples",
    "eval.pass_k",
    "eval.pass_k_problems",
    "checkpoint.every",
    "checkpoint.keep",
    "checkpoint.preempt_seconds",
    "log_every",
    "essa.rows_per_chunk",
    "sft.micro_batch_size",
    "grpo.micro_batch_size",
    "model.remat",
)
_ABSENT = "<absent>"
# errno values a user fixes (free space, permissions, another path), with the advice of each.
_USER_ERRNOS = {
    errno.ENOSPC: "free space on that filesystem or use another --workdir",
    errno.EDQUOT: "free space within the quota or use another --workdir",
    errno.EFBIG: "raise the file size limit (ulimit -f) or use another --workdir",
    errno.EROFS: "use a --workdir on a writable filesystem",
    errno.EACCES: "make it writable by this user or use another --workdir",
    errno.EPERM: "make it writable by this user or use another --workdir",
}


def write_text_atomic(path: str, text: str) -> None:
    """Write `text` to `path` whole or not at all (a temporary file beside it, then rename)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def replace_dir(tmp: str, final: str) -> None:
    """Move the complete directory `tmp` to `final`, replacing an older `final` only once `tmp`
    is complete: the old one is renamed aside first and removed after (a crash in between leaves
    both, never neither)."""
    old = f"{final}.old-{os.getpid()}"
    if os.path.exists(final):
        os.replace(final, old)
    os.replace(tmp, final)
    if os.path.exists(old):
        shutil.rmtree(old, ignore_errors=True)


def remove_partial_checkpoints(directory: str) -> list[str]:
    """Remove the ``*.orbax-checkpoint-tmp-*`` directories of a killed write in `directory`;
    returns their names (orbax never reads them; removed so they neither fill the disk nor look
    like data)."""
    if not os.path.isdir(directory):
        return []
    names = sorted(n for n in os.listdir(directory) if PARTIAL_CHECKPOINT in n)
    for name in names:
        shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
    return names


def os_error_line(e: OSError, workdir: str) -> str | None:
    """One line for an OSError a user can fix (no space, quota, file size limit, read-only or not
    writable), naming the path (`workdir` when the error names none: a failed write() does not)
    and the cause; None for any other OSError (a bug: traceback)."""
    if e.errno not in _USER_ERRNOS:
        return None
    path = e.filename or workdir
    cause = e.strerror or os.strerror(e.errno)
    return f"{path}: {cause} (errno {errno.errorcode[e.errno]}); {_USER_ERRNOS[e.errno]}"


def find_os_error(e: BaseException) -> OSError | None:
    """The user-fixable OSError behind `e` (orbax and the tokenizers wrap the OSError of a failed
    write or read in their own exceptions: `checkpointing.os_error_in`), or None."""
    found = os_error_in(e)
    return found if found is not None and found.errno in _USER_ERRNOS else None


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class WorkdirLock:
    """An exclusive lock on a workdir for one run's life (`acquire`, `release`).

    `acquire` raises WorkdirError naming the holder (pid, host, start, command) when another run
    holds the lock, and returns a line ("taking over the stale lock of ...") when the file names a
    process that died without releasing it (None otherwise).
    """

    def __init__(self, workdir: str):
        self.path = os.path.join(workdir, LOCK_FILE)
        self._fd: int | None = None

    def acquire(self) -> str | None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise WorkdirError(
                f"{os.path.dirname(self.path)} is in use by another run ({holder}); wait for it to "
                "end or use another --workdir"
            ) from None
        previous = _read_holder(fd)
        line = None
        if previous:
            line = f"taking over the stale lock {self.path} of a run that ended without releasing "
            line += f"it ({previous})"
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "command": " ".join(sys.argv),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        self._fd = fd
        return line

    def release(self) -> None:
        """Empty the file (a released lock names nobody) and drop the flock."""
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _read_holder(fd: int) -> str:
    """The lock file's holder as text ('' for an empty file)."""
    text = os.pread(fd, 4096, 0).decode(errors="replace").strip()
    if not text:
        return ""
    try:
        h = json.loads(text)
        state = "running" if _process_alive(int(h["pid"])) else "no longer running"
        return f"pid {h['pid']} on {h['host']}, {state}, started {h['started']}: {h['command']}"
    except (ValueError, KeyError, TypeError):
        return text[:200]


# Fields read only when a run starts (prefixes): the initial step size of the search, and the
# SFT that makes the starting adapter (never repeated on resume). A forced change of one is
# accepted but takes no effect on the restored state, and the run says so in one line.
FIXED_AT_START = ("essa.sigma_init", "sft.")


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"a.b": value}` of a nested config dict (as read from config.json)."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        if isinstance(v, Mapping):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_changes(
    old: Mapping[str, Any], new: Mapping[str, Any]
) -> tuple[dict[str, tuple[Any, Any]], dict[str, tuple[Any, Any]]]:
    """(meaning-changing, allowed) changes from config `old` to `new` (nested JSON dicts), each
    `{field: (old, new)}`; a field missing on one side is `"<absent>"` there."""
    a, b = flatten(old), flatten(new)
    changed = {
        f: (a.get(f, _ABSENT), b.get(f, _ABSENT))
        for f in sorted(set(a) | set(b))
        if a.get(f, _ABSENT) != b.get(f, _ABSENT)
    }
    allowed = {f: v for f, v in changed.items() if f in MAY_CHANGE}
    meaning = {f: v for f, v in changed.items() if f not in MAY_CHANGE}
    return meaning, allowed


def describe_changes(changes: Mapping[str, tuple[Any, Any]]) -> str:
    """`field old -> new, ...` (JSON-style values)."""
    return ", ".join(f"{f} {json.dumps(o)} -> {json.dumps(n)}" for f, (o, n) in changes.items())


def read_record(workdir: str) -> dict[str, Any] | None:
    """The config of the run in `workdir` (its config.json), or None when it has none."""
    path = os.path.join(workdir, CONFIG_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def check_resume(
    workdir: str,
    new: Mapping[str, Any],
    step: int,
    *,
    allow_change: bool = False,
    record_changes: bool = True,
) -> str | None:
    """Compare a resumed run's config `new` (nested JSON dict) with the workdir's record.

    Raises WorkdirError listing every meaning-changing field, old -> new, unless `allow_change`.
    Returns a line describing the accepted changes (None when there are none), after appending
    them to ``config_changes.jsonl`` (step resumed from, fields, whether forced) when
    `record_changes` (process 0). Writes nothing when it refuses; the caller rewrites config.json
    only after this returns.
    """
    old = read_record(workdir)
    if old is None:
        return None
    meaning, allowed = config_changes(old, new)
    if meaning and not allow_change:
        raise WorkdirError(
            f"resuming {workdir} at step {step} with a config that changes the run's meaning: "
            f"{describe_changes(meaning)} (vs its {CONFIG_FILE}); use the same values, another "
            "--workdir, or --allow_config_change to resume anyway"
        )
    if not meaning and not allowed:
        return None
    row = {
        "step": step,
        "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "changes": {f: list(v) for f, v in {**allowed, **meaning}.items()},
        "forced": sorted(meaning),
    }
    if record_changes:
        with open(os.path.join(workdir, CHANGES_FILE), "a") as f:
            f.write(json.dumps(row) + "\n")
    parts = [f"changed settings {describe_changes(allowed)}"] if allowed else []
    if meaning:
        parts.append(f"forced by --allow_config_change: {describe_changes(meaning)}")
    return f"resuming at step {step} with {'; '.join(parts)} (recorded in {CHANGES_FILE})"
