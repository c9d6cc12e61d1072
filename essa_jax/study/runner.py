"""Run a study's `RunSpec`s: one process per core, pinned, resumable, recorded, archived.

- A run is finished when its workdir holds summary.json; an interrupted one resumes from its
  checkpoint (`python -m essa_jax.main` does that itself). Its overrides are written to
  `run_plan.json` when it first starts, and a later start with other overrides is refused: one
  workdir, one plan.
- Each run is pinned to one core (`taskset -c`, which execs the command: the same process, so its
  rusage is the run's); `run_record.json` gets one segment per invocation: commit, core, start
  time, seconds, exit status, peak RSS, the process's CPU seconds, the host's load average before
  and after. A run started at another commit is refused unless the caller allows a mix.
- `sync_records` copies every finished run's small records (and a start's adapter, which later
  runs read) between the workdirs and an archive committed with the results, both ways: a session
  that ends loses only the runs in flight, and the next resumes from the archive.
- `run_study` plans, runs what is ready (a run's `after` finished), replans (the sweep's choices
  decide the final runs), until nothing is left.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from essa_jax.study.spec import RunSpec, check_equal_effort, plan_study

SUMMARY = "summary.json"
RUN_RECORD = "run_record.json"
RUN_PLAN = "run_plan.json"
# What a finished run's record is made of: small text files (the report reads only these), and
# the SFT adapter of a start run (every later run of its task reads it as sft.init_from).
RECORD_FILES = (SUMMARY, "metrics.jsonl", RUN_RECORD, RUN_PLAN)
RECORD_DIRS = ("adapter",)


def write_json(path: str, payload: Any) -> None:
    from essa_jax.workdir import write_text_atomic

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_text_atomic(path, json.dumps(payload, indent=1) + "\n")


def read_json(path: str) -> Any:
    with open(path) as f:
        return json.load(f)


def finished(workdir: str) -> bool:
    return os.path.exists(os.path.join(workdir, SUMMARY))


def git_commit(root: str) -> str:
    """HEAD of the checkout at `root`, refused when tracked files differ from it (a run must be
    traceable to one commit)."""
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if dirty:
        raise SystemExit(
            f"{root} has uncommitted changes to tracked files; commit them (or run from a clean "
            "worktree: git worktree add W <commit>) so every run names the code it ran"
        )
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.strip()


def load_average() -> float:
    try:
        return float(os.getloadavg()[0])
    except OSError:
        return float("nan")


def run_pinned(
    cmd: Sequence[str], core: int, log: Any, cwd: str, env: Mapping[str, str] | None = None
) -> tuple[int, Any]:
    """Run `cmd` on CPU `core` only (`taskset -c`); (exit status, its rusage)."""
    proc = subprocess.Popen(
        ["taskset", "-c", str(core), *cmd],
        cwd=cwd,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=None if env is None else {**os.environ, **env},
    )
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    return proc.returncode, usage


def _flag(value: Any) -> str:
    """A value as ml_collections' `--config.<field>=` parses it."""
    if isinstance(value, tuple | list):
        return "(" + ", ".join(_flag(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return str(value)


def command(python: str, spec: RunSpec) -> list[str]:
    cmd = [python, "-m", "essa_jax.main", "--config", spec.config, "--workdir", spec.workdir]
    return cmd + [f"--config.{k}={_flag(v)}" for k, v in spec.overrides.items()]


def check_plan(spec: RunSpec) -> None:
    """Write the run's plan on its first start; refuse a workdir started with other overrides."""
    path = os.path.join(spec.workdir, RUN_PLAN)
    plan = json.loads(json.dumps(dict(spec.overrides), default=list))
    if os.path.exists(path):
        old = read_json(path)
        if old != plan:
            changed = sorted(k for k in set(old) | set(plan) if old.get(k) != plan.get(k))
            raise SystemExit(
                f"{spec.workdir} was started with other settings ({', '.join(changed)}); move it "
                "away or use another study out"
            )
    else:
        write_json(path, plan)


def execute(
    spec: RunSpec, core: int, *, python: str, commit: str, root: str, allow_commit_mix: bool
) -> int:
    """One invocation of `spec` on `core` (resuming it when interrupted before); its segment
    appended to run_record.json; the exit status."""
    os.makedirs(spec.workdir, exist_ok=True)
    check_plan(spec)
    rec_path = os.path.join(spec.workdir, RUN_RECORD)
    rec = read_json(rec_path) if os.path.exists(rec_path) else {"commit": commit, "segments": []}
    if rec["commit"] != commit and not allow_commit_mix:
        raise SystemExit(
            f"{spec.workdir} was started at commit {rec['commit'][:10]}, this is {commit[:10]}: "
            "resume it from a worktree at its commit, or allow a commit mix"
        )
    t0, load0 = time.time(), load_average()
    with open(os.path.join(spec.workdir, "log.txt"), "a") as log:
        rc, usage = run_pinned(command(python, spec), core, log, root)
    rec["segments"].append(
        {
            "commit": commit,
            "core": core,
            "started": datetime.datetime.fromtimestamp(t0, datetime.UTC).isoformat(),
            "seconds": time.time() - t0,
            "cpu_seconds": usage.ru_utime + usage.ru_stime,
            "exit": rc,
            "peak_rss_mb": usage.ru_maxrss / 1024,  # Linux reports ru_maxrss in KiB
            "load_before": load0,
            "load_after": load_average(),
        }
    )
    write_json(rec_path, rec)
    return rc


def schedule(
    specs: Sequence[RunSpec],
    cores: Sequence[int],
    run_one: Callable[[RunSpec, int], int],
    done: Callable[[str], bool] = finished,
    log: Callable[[str], None] = print,
    after_run: Callable[[RunSpec], Any] = lambda spec: None,
    start_until: float | None = None,
) -> list[RunSpec]:
    """Every unfinished spec whose `after` runs are finished (or finish meanwhile), one per core of
    `cores` at a time; returns the specs that ran. `after_run(spec)` follows each finished run,
    one at a time (the archive: a session that ends loses only the runs in flight). A failed run
    (non-zero exit) stops new starts: those running finish, then SystemExit names it. No run
    starts after `start_until` (time.time()): a session about to end would lose it unfinished."""
    todo = [s for s in specs if not done(s.workdir)]
    ran: list[RunSpec] = []
    lock = threading.Condition()
    free = list(cores)
    failed: list[str] = []

    def ready(s: RunSpec) -> bool:
        return all(done(w) for w in s.after)

    def worker() -> None:
        while True:
            with lock:
                while True:
                    if failed or (start_until is not None and time.time() > start_until):
                        return
                    pending = [s for s in todo if s not in ran]
                    if not pending:
                        return
                    nxt = next((s for s in pending if ready(s)), None)
                    waiting = any(not done(w) for s in ran for w in [s.workdir])
                    if nxt is not None and free:
                        core = free.pop(0)
                        ran.append(nxt)
                        break
                    if nxt is None and not waiting:
                        return  # what is left waits on runs outside this schedule
                    lock.wait(timeout=5.0)
            log(f"[{time.strftime('%H:%M:%S')}] {nxt.label} -> {nxt.workdir} [core {core}]")
            try:
                rc = run_one(nxt, core)
            except BaseException as e:  # noqa: BLE001 - reported once all workers stop
                rc, msg = -1, str(e)
            else:
                msg = f"exit {rc}; see {nxt.workdir}/log.txt"
            with lock:
                free.append(core)
                if rc != 0 or not done(nxt.workdir):
                    failed.append(f"{nxt.label}: {msg}")
                else:
                    after_run(nxt)
                lock.notify_all()

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(cores)) as pool:
        for f in [pool.submit(worker) for _ in cores]:
            f.result()
    if failed:
        raise SystemExit("a study run failed: " + "; ".join(failed))
    return ran


def sync_records(src: str, dst: str) -> list[str]:
    """Copy the records (RECORD_FILES, RECORD_DIRS) of every finished run under `src` to the same
    relative folder under `dst` where `dst` does not hold that finished run yet; summary.json is
    copied last, so a copy cut short leaves an unfinished run, never a partial record. Returns
    the relative folders copied."""
    copied = []
    if not os.path.isdir(src):
        return copied
    for dirpath, dirnames, present in os.walk(src):
        if SUMMARY not in present:
            continue
        rel = os.path.relpath(dirpath, src)
        target = os.path.join(dst, rel)
        if os.path.exists(os.path.join(target, SUMMARY)):
            continue
        os.makedirs(target, exist_ok=True)
        for name in RECORD_DIRS:
            if name in dirnames:
                tmp = os.path.join(target, f".{name}.tmp")
                shutil.rmtree(tmp, ignore_errors=True)
                shutil.copytree(os.path.join(dirpath, name), tmp)
                shutil.rmtree(os.path.join(target, name), ignore_errors=True)
                os.replace(tmp, os.path.join(target, name))
        for name in [f for f in RECORD_FILES if f != SUMMARY and f in present] + [SUMMARY]:
            shutil.copy2(os.path.join(dirpath, name), os.path.join(target, name))
        copied.append(rel)
    return sorted(copied)


def run_study(
    study: Any,
    *,
    jobs: int,
    first_core: int,
    python: str,
    root: str,
    allow_commit_mix: bool = False,
    after_each: Callable[[], Any] = lambda: None,
    stages: Sequence[str] = ("start", "sweep", "final"),
    start_until: float | None = None,
) -> None:
    """Plan, run what is ready, archive, replan, until nothing of `stages` is left or no run may
    start any more (`start_until`, as in `schedule`; module docstring). `after_each` runs after
    every batch (the report)."""
    from essa_jax.study.report import choices

    commit = git_commit(root)
    cores = list(range(first_core, first_core + jobs))
    while True:
        sync_records(study.archive, study.out)
        specs = [s for s in plan_study(study, choices(study)) if s.stage in stages]
        check_equal_effort(study, plan_study(study))
        ran = schedule(
            specs,
            cores,
            lambda s, core: execute(
                s,
                core,
                python=python,
                commit=commit,
                root=root,
                allow_commit_mix=allow_commit_mix,
            ),
            after_run=lambda spec: sync_records(study.out, study.archive),
            start_until=start_until,
        )
        sync_records(study.out, study.archive)
        after_each()
        if not ran or (start_until is not None and time.time() > start_until):
            return
