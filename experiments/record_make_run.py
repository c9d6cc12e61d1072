"""Run `make run` (the default ESSA config) in a fresh workdir and commit-ready copy its summary.

docs/RESULTS.md's `make run` table quotes experiments/results/make_run.json, written here: the run's
summary.json plus when it ran, how long the whole command took, the machine's load average before
and after (the ESSA loop is capped at 600 s of wall-clock, so a loaded machine runs fewer
generations), and whether the operator declared the machine quiet.

    .venv/bin/python experiments/record_make_run.py --quiet_machine   # nothing else running
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = "experiments/configs/essa_smollm2_arith.py"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workdir", default="runs/make_run_record")
    p.add_argument("--results", default="experiments/results/make_run.json")
    p.add_argument("--quiet_machine", action="store_true", help="record that nothing else ran")
    p.add_argument("--python", default=sys.executable)
    args = p.parse_args(argv)
    os.chdir(ROOT)
    if os.path.exists(args.workdir):
        shutil.rmtree(args.workdir)  # a fresh run, never a resumed one
    load_before = os.getloadavg()
    started = datetime.datetime.now(datetime.UTC)
    t0 = time.perf_counter()
    cmd = [args.python, "-m", "essa_jax.main", "--config", CONFIG, "--workdir", args.workdir]
    rc = subprocess.call(cmd)
    wall = time.perf_counter() - t0
    if rc:
        print(f"error: the run failed (exit {rc})", file=sys.stderr)
        return rc
    with open(os.path.join(args.workdir, "summary.json")) as f:
        summary = json.load(f)
    record = {
        "date": started.isoformat(timespec="minutes"),
        "command": "make run (" + " ".join(cmd[1:]) + ")",
        "config": CONFIG,
        "machine": "2-core CPU (project CI class), float32",
        "quiet_machine": bool(args.quiet_machine),
        "load_average_1_5_15_before": [round(x, 2) for x in load_before],
        "load_average_1_5_15_after": [round(x, 2) for x in os.getloadavg()],
        "whole_run_wall_seconds": round(wall, 1),
        "summary": summary,
    }
    os.makedirs(os.path.dirname(args.results), exist_ok=True)
    with open(args.results, "w") as f:
        json.dump(record, f, indent=1)
    print(f"-> {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
