"""`python -m essa_jax.study --study FILE [--jobs N] [--dry_run | --report_only]`."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from collections.abc import Sequence

from essa_jax.study.spec import check_equal_effort, extension_runs, load_study, plan_study


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m essa_jax.study", description=__doc__)
    ap.add_argument("--study", required=True, help="a study file defining get_study()")
    ap.add_argument("--jobs", type=int, default=1, help="runs at a time, one core each")
    ap.add_argument("--first_core", type=int, default=0)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--stages", default="start,sweep,final", help="which stages to run")
    ap.add_argument("--dry_run", action="store_true", help="print the plan, run nothing")
    ap.add_argument("--report_only", action="store_true", help="the report from what is done")
    ap.add_argument("--allow_commit_mix", action="store_true")
    ap.add_argument(
        "--start_for_minutes",
        type=float,
        default=0.0,
        help="start no new run after this many minutes (0: no limit); runs in flight finish",
    )
    return ap.parse_args(argv)


def write_report(study) -> dict:
    from essa_jax.study.report import build_report
    from essa_jax.study.runner import write_json

    payload = build_report(study)
    payload["written"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    payload["machine"] = {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
    }
    write_json(study.results, payload)
    from essa_jax.study.report import format_tables, plot

    plot(payload, os.path.splitext(study.results)[0] + ".png")
    print(format_tables(payload), flush=True)
    print(
        f"report: {study.results} ({len(payload['runs'])} finished runs, "
        f"{len(payload['unfinished'])} unfinished)",
        flush=True,
    )
    return payload


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if not args.start_for_minutes >= 0:
        print(f"error: --start_for_minutes {args.start_for_minutes}: must be >= 0", file=sys.stderr)
        return 2
    try:
        study = load_study(args.study)
        specs = plan_study(study)
        check_equal_effort(study, specs)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        from essa_jax.study.report import choices
        from essa_jax.study.runner import finished, sync_records

        # What the archive holds is done (a fresh checkout has no workdirs yet).
        sync_records(study.archive, study.out)

        for s in plan_study(study, choices(study)):
            state = "done" if finished(s.workdir) else "todo"
            print(f"{state}  {s.label:<50} {s.workdir}")
        effort = {
            "sweep_runs_per_arm": check_equal_effort(study, specs),
            "extension_runs_per_arm": extension_runs(specs),
        }
        print(json.dumps(effort))
        return 0
    if not args.report_only:
        import time

        from essa_jax.study.runner import run_study

        root = os.getcwd()
        run_study(
            study,
            jobs=args.jobs,
            first_core=args.first_core,
            python=args.python,
            root=root,
            allow_commit_mix=args.allow_commit_mix,
            after_each=lambda: write_report(study),
            stages=tuple(args.stages.split(",")),
            start_until=time.time() + 60 * args.start_for_minutes
            if args.start_for_minutes > 0
            else None,
        )
    else:
        from essa_jax.study.runner import sync_records

        # The report reads `out`; a fresh checkout has only the archive's records.
        sync_records(study.archive, study.out)
    write_report(study)
    return 0


if __name__ == "__main__":
    sys.exit(main())
