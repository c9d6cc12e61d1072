"""essa_jax.workdir: the lock, whole-file writes, the run's record (issue #31). In-process and fast;
tests/test_run_faults.py runs the same through the command line."""

import errno
import json
import os
import subprocess

import pytest

from essa_jax.checkpointing import WorkdirError, os_error_in
from essa_jax.config import base_config
from essa_jax.workdir import (
    MAY_CHANGE,
    WorkdirLock,
    check_resume,
    config_changes,
    find_os_error,
    flatten,
    os_error_line,
    write_text_atomic,
)


def _record():
    return json.loads(base_config().to_json_best_effort())


def test_every_field_that_may_change_is_a_field():
    fields = set(flatten(_record()))
    assert set(MAY_CHANGE) <= fields, sorted(set(MAY_CHANGE) - fields)
    # The meaning-changing side is everything else, the examples included.
    for f in ("method", "seed", "model.path", "task.reward", "essa.population_size",
              "lora.rank", "essa.strategy", "essa.sigma_init", "grpo.learning_rate"):  # fmt: skip
        assert f in fields and f not in MAY_CHANGE, f


def test_config_changes_splits_meaning_from_budget():
    old, new = _record(), _record()
    new["seed"], new["lora"]["rank"], new["essa"]["generations"] = 3, 8, 99
    meaning, allowed = config_changes(old, new)
    assert meaning == {"seed": (0, 3), "lora.rank": (4, 8)}
    assert allowed == {"essa.generations": (40, 99)}
    assert config_changes(old, old) == ({}, {})


def test_refused_resume_writes_nothing_and_an_accepted_one_is_recorded(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(_record()))
    new = _record()
    new["task"]["reward"] = "char_match"
    with pytest.raises(WorkdirError, match=r'task.reward "" -> "char_match"'):
        check_resume(str(tmp_path), new, 5)
    assert not (tmp_path / "config_changes.jsonl").exists()
    new["log_every"] = 2
    line = check_resume(str(tmp_path), new, 5, allow_change=True)
    assert "changed settings log_every 1 -> 2" in line and "forced" in line
    row = json.loads((tmp_path / "config_changes.jsonl").read_text())
    assert row["step"] == 5 and row["forced"] == ["task.reward"]


def test_lock_refuses_a_second_holder_and_takes_over_a_dead_ones(tmp_path):
    first, second = WorkdirLock(str(tmp_path)), WorkdirLock(str(tmp_path))
    assert first.acquire() is None
    with pytest.raises(
        WorkdirError, match=rf"in use by another run \(pid {os.getpid()} on .*, running"
    ):
        second.acquire()
    first.release()
    assert (tmp_path / "run.lock").read_text() == ""  # released: names nobody
    assert second.acquire() is None
    second.release()
    dead = subprocess.Popen(["true"])
    dead.wait()
    holder = {"pid": dead.pid, "host": "h", "started": "t", "command": "c"}
    (tmp_path / "run.lock").write_text(json.dumps(holder))
    lock = WorkdirLock(str(tmp_path))
    line = lock.acquire()
    assert line is not None and f"pid {dead.pid} on h, no longer running" in line
    assert json.loads((tmp_path / "run.lock").read_text())["pid"] == os.getpid()
    lock.release()


def test_a_failed_whole_file_write_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    path.write_text("old")

    def full(*_):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OSError):
        write_text_atomic(str(path), "new")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["config.json"]


def test_os_errors_behind_orbax_become_one_line():
    # tensorstore's text of a failed write, inside orbax's ValueError
    e = ValueError(
        'RESOURCE_EXHAUSTED: Error writing local file "/w/checkpoints/3.orbax-checkpoint-tmp/x": '
        "Failed to write 377 bytes to file 7: No space left on device [os_error_code='28']"
    )
    found = os_error_in(e)
    assert (
        found.errno == errno.ENOSPC and found.filename == "/w/checkpoints/3.orbax-checkpoint-tmp/x"
    )
    assert os_error_line(find_os_error(e), "/w") == (
        "/w/checkpoints/3.orbax-checkpoint-tmp/x: No space left on device (errno ENOSPC); free "
        "space on that filesystem or use another --workdir"
    )
    wrapped = RuntimeError("save failed")
    wrapped.__cause__ = OSError(errno.EROFS, "Read-only file system")
    assert "/w: Read-only file system (errno EROFS)" in os_error_line(find_os_error(wrapped), "/w")
    assert find_os_error(OSError(errno.ENOENT, "No such file")) is None  # a bug, not the user's
