"""Nothing silently wrong (issue #31): the command line under signals, a second run, a changed
config on resume, a reward that failed, a full or read-only disk.

Every case runs `python -m essa_jax.main` in a subprocess on the tiny random model
(tests/distributed/tiny_essa_config.py: a dense reward, so the search moves every step) and checks
the exit status, that stderr is exactly one line, and that what earlier runs wrote is intact.
Resumes are compared with an uninterrupted run leaf for leaf, after asserting that the state moved.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from cli_runs import cli_env
from search_moved import TINY_ESSA_PER_GENERATION, assert_essa_moved, lora_movement

from essa_jax.checkpointing import complete_steps

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "tests" / "distributed" / "tiny_essa_config.py"
# Enough steps that a signal sent after step 2 lands well before the end (a tiny GRPO step takes
# ~10 ms once compiled, an ESSA generation ~0.1 s); checkpoints at 0, on a signal and at the end.
ESSA = ["--config.essa.generations=40", "--config.checkpoint.every=0"]
GRPO = [
    "--config.method=grpo",
    "--config.grpo.steps=300",
    "--config.grpo.batch_size=8",
    "--config.grpo.group_size=4",
    "--config.grpo.learning_rate=0.01",
    "--config.checkpoint.every=0",
]
SFT_ONLY = ["--config.method=sft", "--config.sft.steps=2"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return cli_env(str(tmp_path_factory.mktemp("jax_cache")))


def _cmd(workdir, *args, config=CONFIG):
    return [sys.executable, "-m", "essa_jax.main", f"--config={config}", f"--workdir={workdir}"]


def run(env, workdir, *args, config=CONFIG, **kw) -> subprocess.CompletedProcess:
    cmd = [*_cmd(workdir, config=config), *args]
    return subprocess.run(
        cmd, cwd=ROOT, env={**env, **kw}, capture_output=True, text=True, timeout=600
    )


def start(env, workdir, *args, log) -> subprocess.Popen:
    return subprocess.Popen(
        [*_cmd(workdir), *args], cwd=ROOT, env=env, stdout=log, stderr=subprocess.PIPE, text=True
    )


def one_line(rc: int, stderr: str, want_rc: int, *expected: str) -> str:
    """Exit status `want_rc` and exactly one stderr line holding every `expected`."""
    assert rc == want_rc, (rc, stderr[-3000:])
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr[-3000:]
    for e in expected:
        assert e in lines[0], (e, lines[0])
    return lines[0]


def train_steps(workdir) -> list[int]:
    path = Path(workdir) / "metrics.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [r["step"] for r in rows if r["phase"] == "train"]


def wait_for_step(p: subprocess.Popen, workdir, step: int, timeout: float = 500) -> None:
    deadline = time.monotonic() + timeout
    while not any(s >= step for s in train_steps(workdir)):
        assert p.poll() is None, p.stderr.read()[-3000:]
        assert time.monotonic() < deadline, f"no step {step} within {timeout}s"
        time.sleep(0.02)


def checkpoint(workdir, step):
    d = Path(workdir) / "checkpoints" / str(step)
    state = ocp.StandardCheckpointer().restore(str(d / "state"))
    meta = json.loads((d / "meta" / "metadata").read_text())
    return state, meta


def assert_same_state(a, b) -> None:
    flat_a = jax.tree_util.tree_flatten_with_path(a)[0]
    flat_b = dict(jax.tree_util.tree_flatten_with_path(b)[0])
    assert len(flat_a) == len(flat_b) > 0
    for path, leaf in flat_a:
        np.testing.assert_array_equal(
            np.asarray(flat_b[path]), np.asarray(leaf), err_msg=jax.tree_util.keystr(path)
        )


def train_rows(meta) -> list[dict]:
    """The logged training rows without the timings (seconds, rates: no two runs share them)."""
    return [
        {k: v for k, v in r.items() if not (k.endswith("_s") or k.endswith("_per_s"))}
        for r in meta["history"]
        if r["phase"] == "train"
    ]


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _interrupt_and_resume(env, tmp_path, overrides, total, moved):
    """Uninterrupted run; the same run given SIGTERM after step 2 (exit 143, one line, a
    checkpoint at the step it stopped); its resume equals the uninterrupted run after `moved`
    asserted that the state moved from the interrupted step to the end."""
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    proc = run(env, ref, *overrides)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp_path / "cut.log", "w") as log:
        p = start(env, cut, *overrides, log=log)
        wait_for_step(p, cut, 2)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=120)
    line = one_line(p.returncode, err, 143, "SIGTERM received: stopped after step")
    k = int(line.split("stopped after step ")[1].split()[0])
    assert 2 <= k < total, line
    assert complete_steps(str(cut / "checkpoints")) == [0, k]
    assert train_steps(cut) == list(range(1, k + 1))  # every step logged once, up to the stop
    assert not (cut / "summary.json").exists()

    # A killed write's temporary directory and a dead run's lock are found at the next start.
    partial = cut / "checkpoints" / f"{k + 1}.orbax-checkpoint-tmp-123"
    partial.mkdir()
    holder = {"pid": dead_pid(), "host": "h", "started": "t", "command": "essa-jax"}
    (cut / "run.lock").write_text(json.dumps(holder))
    proc = run(env, cut, *overrides)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resuming from {cut}/checkpoints/{k}" in proc.stdout
    assert f"taking over the stale lock {cut}/run.lock" in proc.stdout
    assert f"pid {holder['pid']} on h, no longer running" in proc.stdout
    assert f"removed {cut}/checkpoints/{partial.name}" in proc.stdout and not partial.exists()

    stopped, _ = checkpoint(cut, k)
    final_ref, meta_ref = checkpoint(ref, total)
    final_cut, meta_cut = checkpoint(cut, total)
    moved(stopped, final_cut)
    assert_same_state(final_ref, final_cut)
    assert [r["step"] for r in train_rows(meta_cut)] == list(range(1, total + 1))
    assert train_rows(meta_cut) == train_rows(meta_ref)


@pytest.mark.slow
def test_sigterm_essa_checkpoints_and_resumes_exactly(env, tmp_path):
    def moved(a, b):
        assert_essa_moved(a, b, **TINY_ESSA_PER_GENERATION, what="after the stop:")

    _interrupt_and_resume(env, tmp_path, ESSA, 40, moved)


@pytest.mark.slow
def test_sigterm_grpo_checkpoints_and_resumes_exactly(env, tmp_path):
    def moved(a, b):
        assert lora_movement(a["grpo"]["params"], b["grpo"]["params"]) > 1e-3

    _interrupt_and_resume(env, tmp_path, GRPO, 300, moved)


@pytest.mark.slow
def test_second_run_on_a_workdir_refuses_and_the_first_is_intact(env, tmp_path):
    work = tmp_path / "run"
    forever = ["--config.essa.generations=100000", "--config.checkpoint.every=0"]
    with open(tmp_path / "first.log", "w") as log:
        first = start(env, work, *forever, log=log)
        wait_for_step(first, work, 1)
        second = run(env, work, *forever)
        one_line(
            second.returncode, second.stderr, 2, f"{work} is in use by another run",
            f"pid {first.pid} on", "running", "use another --workdir",
        )  # fmt: skip
        assert first.poll() is None
        first.send_signal(signal.SIGINT)  # Ctrl-C: the same graceful stop, status 130
        _, err = first.communicate(timeout=120)
    line = one_line(first.returncode, err, 130, "SIGINT received: stopped after step")
    k = int(line.split("stopped after step ")[1].split()[0])
    # The first run's metrics hold its own steps once each, as its checkpoint does.
    assert train_steps(work) == list(range(1, k + 1))
    _, meta = checkpoint(work, k)
    rows = [json.loads(x) for x in (work / "metrics.jsonl").read_text().splitlines()]
    assert rows == meta["history"]


def test_resume_refuses_a_changed_meaning_and_keeps_the_record(env, tmp_path):
    work = tmp_path / "run"
    proc = run(env, work, *SFT_ONLY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = (work / "config.json").read_bytes()
    metrics = (work / "metrics.jsonl").read_bytes()
    changed = ["--config.seed=1", "--config.lora.rank=1", "--config.essa.population_size=6"]
    proc = run(env, work, *SFT_ONLY, *changed, "--config.eval.batch_size=4")
    one_line(
        proc.returncode, proc.stderr, 2, "changes the run's meaning",
        "seed 0 -> 1", "lora.rank 2 -> 1", "essa.population_size 8 -> 6",
        "--allow_config_change",
    )  # fmt: skip
    assert "eval.batch_size" not in proc.stderr  # allowed: not listed as a refusal
    assert (work / "config.json").read_bytes() == record  # the record is kept
    assert (work / "metrics.jsonl").read_bytes() == metrics
    assert not (work / "config_changes.jsonl").exists()

    # An allowed field alone goes through and is logged; a meaning change with the flag too.
    proc = run(env, work, *SFT_ONLY, "--config.eval.batch_size=4", "--config.seed=1",
               "--allow_config_change")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "changed settings eval.batch_size 8 -> 4" in proc.stdout
    assert "forced by --allow_config_change: seed 0 -> 1" in proc.stdout
    changes = [json.loads(x) for x in (work / "config_changes.jsonl").read_text().splitlines()]
    assert changes[0]["changes"] == {"eval.batch_size": [8, 4], "seed": [0, 1]}
    assert changes[0]["forced"] == ["seed"] and changes[0]["step"] == 0
    assert json.loads((work / "config.json").read_text())["seed"] == 1


def test_a_forced_shape_change_is_refused_before_anything_is_written(env, tmp_path):
    """--allow_config_change with a field that changes the state's shapes: refused in one line
    from the checkpoint's metadata, before a restore could mistake the step for a broken one;
    config.json, config_changes.jsonl and every checkpoint stay as they were, and the run's own
    command still resumes. A forced change of a field read only at the start is said."""
    work = tmp_path / "run"
    proc = run(env, work, "--config.essa.generations=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = (work / "config.json").read_bytes()
    steps = sorted(os.listdir(work / "checkpoints"))
    assert steps  # the state to protect exists
    proc = run(env, work, "--config.essa.generations=3", "--config.essa.population_size=6",
               "--allow_config_change")  # fmt: skip
    one_line(
        proc.returncode, proc.stderr, 2, "cannot resume", "essa.population_size 8 -> 6",
        "changes the saved state's shapes", "this config (", "nothing was changed",
    )  # fmt: skip
    assert (work / "config.json").read_bytes() == record
    assert not (work / "config_changes.jsonl").exists()
    assert sorted(os.listdir(work / "checkpoints")) == steps  # nothing quarantined
    proc = run(env, work, "--config.essa.generations=3", "--config.essa.sigma_init=0.5",
               "--allow_config_change")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "note: essa.sigma_init 1.0 -> 0.5 takes no effect" in out, out[-3000:]
    assert train_steps(work) == [1, 2, 3]
    changes = [json.loads(x) for x in (work / "config_changes.jsonl").read_text().splitlines()]
    assert changes[0]["forced"] == ["essa.sigma_init"] and changes[0]["step"] == 2


FLAKY_REWARD_CONFIG = """
import os

from essa_jax.config import load_config_file
from essa_jax.rewards import REWARDS


def flaky(prompts, completions, **_):
    if os.environ.get("BREAK_REWARD"):
        raise KeyError("answer_text")  # the bug the user fixes between the two runs
    return [1.0] * len(completions)


def get_config():
    REWARDS.setdefault("flaky", flaky)  # one name, in both runs: only the code was fixed
    c = load_config_file({config!r})
    c.task.reward = "flaky"
    return c
"""


def test_a_baseline_scored_by_a_broken_reward_is_not_reused(env, tmp_path):
    cfg = tmp_path / "flaky_config.py"
    cfg.write_text(textwrap.dedent(FLAKY_REWARD_CONFIG.format(config=str(CONFIG))))
    work = tmp_path / "run"
    # 8 held-out problems: too few for the guard to judge the reward, so checkpoint 0 is written
    # with an SFT accuracy of 0 from the failures; the first generation's 32 rollouts raise.
    proc = run(env, work, "--config.essa.generations=2", config=cfg, BREAK_REWARD="1")
    one_line(proc.returncode, proc.stderr, 2, "reward 'flaky' failed on")
    assert complete_steps(str(work / "checkpoints")) == [0]
    _, meta = checkpoint(work, 0)
    assert meta["sft_eval"]["acc"] == 0.0

    proc = run(env, work, "--config.essa.generations=2", config=cfg)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SFT held-out accuracy rescored with this run's reward: 1.000" in proc.stdout
    rows = [json.loads(x) for x in (work / "metrics.jsonl").read_text().splitlines()]
    assert [r["acc"] for r in rows if r["phase"] == "eval" and r["step"] == 0] == [1.0]


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir()
    ok = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                        capture_output=True).returncode == 0  # fmt: skip
    return ok


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MB tmpfs (needs root, as CI's containers run): a disk that can really fill up."""
    mnt = tmp_path / "disk"
    if os.geteuid() != 0 or not _mount_tmpfs(mnt, "2m"):
        pytest.skip("mounting a tmpfs needs root")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def _snapshot(work: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(work)): p.read_bytes()
        for p in sorted(work.rglob("*"))
        if p.is_file() and "tb" not in p.parts and p.name != "run.lock"
    }


def test_disk_full_while_checkpointing(env, small_disk):
    work = small_disk / "run"
    # No eval_samples.jsonl: its appended completions would take the ~40 KB left below before the
    # checkpoint does, and this case is the checkpoint's write.
    quiet = ("--config.checkpoint.every=0", "--config.eval.samples_to_log=0")
    proc = run(env, work, "--config.essa.generations=1", *quiet)
    assert proc.returncode == 0, proc.stderr[-3000:]
    before = _snapshot(work)
    # Fill the disk but for ~40 KB: config.json and the metrics fit, a checkpoint (~130 KB) not.
    free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
    (small_disk / "filler").write_bytes(b"\0" * max(free - 40_000, 0))
    proc = run(env, work, "--config.essa.generations=3", *quiet)
    line = one_line(proc.returncode, proc.stderr, 2, "No space left on device", "ENOSPC")
    assert str(work / "checkpoints") in line
    # Nothing the first run wrote is lost (the metrics keep its training rows and gained the new
    # steps'); the partial write is no step (removed at the next start).
    after = _snapshot(work)
    for name, data in before.items():
        if name == "metrics.jsonl":
            assert train_steps(work) == [1, 2, 3]
        elif name != "config.json":  # rewritten whole with the allowed change of generations
            assert after.get(name) == data, name
    assert complete_steps(str(work / "checkpoints")) == [0, 1]


def test_read_only_workdir(env, small_disk):
    work = small_disk / "run"
    proc = run(env, work, *SFT_ONLY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    before = _snapshot(work)
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    proc = run(env, work, *SFT_ONLY)
    one_line(proc.returncode, proc.stderr, 2, str(work), "Read-only file system", "EROFS")
    assert _snapshot(work) == before


def test_every_checkpoint_unreadable_is_one_line(env, tmp_path):
    work = tmp_path / "run"
    proc = run(env, work, *SFT_ONLY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = sorted((work / "checkpoints" / "0" / "state").rglob("d/*"))
    assert data
    for f in data:  # a copy that stopped half-way
        f.write_bytes(f.read_bytes()[:10])
    before = _snapshot(work)
    proc = run(env, work, *SFT_ONLY)
    one_line(
        proc.returncode, proc.stderr, 2, f"no checkpoint in {work}/checkpoints can be restored",
        "checkpoint step 0: ", "move the directory away",
    )  # fmt: skip
    assert _snapshot(work) == before  # nothing renamed, rewritten or removed
