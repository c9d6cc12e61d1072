"""Shared benchmark plumbing: timing, machine description, table printing, JSON results.

Every section prints a table and writes `experiments/results/<name>.json` holding its named numbers
plus the machine (CPU, cores, jax version, date). Compare ratios measured in one run, never absolute
times across runs.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from essa_jax import hostmem

RESULTS_DIR = Path(__file__).resolve().parent.parent / "experiments" / "results"


def machine_info() -> dict[str, Any]:
    """CPU model, core count, library versions and date, stored with every result file."""
    import jax

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "python": platform.python_version(),
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        # glibc's allocator settings the process started with (essa_jax.hostmem): "retained"
        # when `make bench` set them, else glibc's defaults.
        "malloc": "retained" if hostmem.retained_in_effect(os.environ) else "glibc default",
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    return info


def block(x: Any) -> Any:
    """Wait for every jax array in a pytree (async dispatch would otherwise hide the work)."""
    import jax

    return jax.block_until_ready(x)


def time_fn(fn: Callable[[], Any], *, repeats: int = 3, warmup: int = 1) -> dict[str, float]:
    """Run `fn` warmup + repeats times: first (compile) time, then min and median of the rest."""
    t0 = time.perf_counter()
    block(fn())
    first = time.perf_counter() - t0
    for _ in range(max(warmup - 1, 0)):
        block(fn())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        block(fn())
        times.append(time.perf_counter() - t0)
    times.sort()
    return {"first_s": first, "min_s": times[0], "median_s": times[len(times) // 2]}


def print_table(rows: Sequence[dict[str, Any]], title: str = "") -> None:
    """Print rows (dicts with the same keys) as an aligned text table."""
    if title:
        print(f"\n== {title} ==")
    if not rows:
        print("(no rows)")
        return
    cols = list(rows[0].keys())

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    cells = [[fmt(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))


def write_results(name: str, results: dict[str, Any], out: str | None = None) -> Path:
    """Write `experiments/results/<name>.json` (or `<out>.json`: a trial or smoke run's file,
    never over the recorded result) with the machine description added."""
    path = RESULTS_DIR / f"{name}.json" if out is None else Path(out).with_suffix(".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"machine": machine_info(), **results}
    path.write_text(json.dumps(payload, indent=2, sort_keys=False, default=float) + "\n")
    print(f"wrote {path}")
    return path


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB (Linux ru_maxrss is KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
