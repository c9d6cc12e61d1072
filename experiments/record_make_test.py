"""Time `make test` on this machine and record it with per-test durations.

    python experiments/record_make_test.py [--out experiments/results/make_test.json]

Runs `make test` with `--durations=0` (every test's setup / call / teardown
time, as pytest reports it from each xdist worker), then writes the wall-clock, pass / fail
counts, the process tree's CPU seconds, the load average before and after, the per-file totals
and the 40 slowest tests. The previous record is kept under `previous`. Run it with nothing else
on the machine: the load average says whether that held.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import resource
import subprocess
import sys
import time
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DURATION = re.compile(r"^([0-9.]+)s (setup|call|teardown)\s+(\S+)$")
RESULT = re.compile(r"(\d+) (passed|failed|skipped|error|errors|deselected)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "experiments/results/make_test.json"))
    ap.add_argument("--workers", default=os.environ.get("TEST_WORKERS", "2"))
    args = ap.parse_args(argv)
    # The Makefile's own test command (one place says how the suite runs), with the durations.
    cmd = ["make", "test", f"TEST_WORKERS={args.workers}", "PYTEST_ARGS=--durations=0"]
    load0 = os.getloadavg()
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.time() - t0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    text = proc.stdout + proc.stderr
    with open(
        os.path.join(ROOT, "runs", "make_test.log")
        if os.path.isdir(os.path.join(ROOT, "runs"))
        else os.devnull,
        "w",
    ) as f:
        f.write(text)
    tests = defaultdict(float)
    for line in text.splitlines():
        m = DURATION.match(line.strip())
        if m:
            tests[m.group(3)] += float(m.group(1))
    files = defaultdict(float)
    for name, s in tests.items():
        files[name.split("::")[0]] += s
    # pytest's summary line (make's own "Error 1" line follows it when a test failed).
    summary = next((line for line in reversed(text.splitlines()) if RESULT.search(line)), "")
    counts = {k: int(n) for n, k in RESULT.findall(summary)}
    previous = None
    if os.path.exists(args.out):
        with open(args.out) as f:
            previous = json.load(f)
        previous.pop("previous", None)
        previous.pop("slowest_tests", None)
        previous.pop("files", None)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    payload = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="minutes"),
        "commit": commit,
        "command": f"make test (pytest -q -n {args.workers} --dist loadfile tests)",
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "workers": int(args.workers),
        "exit": proc.returncode,
        **counts,
        "wall_seconds": wall,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "load_before": load0,
        "load_after": os.getloadavg(),
        "sum_of_test_seconds": sum(tests.values()),
        "files": dict(sorted(files.items(), key=lambda kv: -kv[1])),
        "slowest_tests": dict(sorted(tests.items(), key=lambda kv: -kv[1])[:40]),
        "previous": previous,
    }
    with open(args.out, "w") as f:
        json.dump(payload, f, indent=1)
    print(
        f"make test: exit {proc.returncode}, {counts}, {wall / 60:.1f} min wall, "
        f"{payload['cpu_seconds'] / 60:.1f} CPU-min -> {args.out}"
    )
    print(text[-3000:] if proc.returncode else "")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
