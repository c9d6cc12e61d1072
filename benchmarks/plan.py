"""`make bench SECTION=plan`: the ahead-of-time memory plan of the paper configs.

Each (config, target) runs `python -m essa_jax.plan` in its own process (the number of virtual
devices is fixed per process) and its rows are collected into `experiments/results/plan.json`: one
row per config x program with the per-device bytes XLA assigns, the device memory, whether it fits
with 10% headroom, the chunk sizes and FLOPs. Compiling 7B / 32B shapes on a CPU takes tens of
seconds per program, which is why this is a benchmark and not a test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from benchmarks.common import print_table, write_results

CONFIGS = "experiments/configs"
# (config file, plan arguments, what the row shows)
GPU8 = ["--devices", "8", "--device_memory_gb", "80"]
CASES = (
    # The 7B paper configs on 8 x H100-80GB, and their per-device bytes as the model axis grows.
    ("essa_qwen2p5_7b_gsm8k", GPU8, "paper: 8 x H100"),
    ("essa_qwen2p5_7b_gsm8k", [*GPU8, "--config.mesh.model=2"], "model axis 2"),
    ("essa_qwen2p5_7b_gsm8k", [*GPU8, "--config.mesh.model=4"], "model axis 4"),
    ("fgrpo_qwen2p5_7b_deepscaler", GPU8, "paper: 8 x H100"),
    ("fgrpo_qwen2p5_7b_deepscaler", [*GPU8, "--config.mesh.model=2"], "model axis 2"),
    ("fgrpo_qwen2p5_7b_deepscaler", [*GPU8, "--config.mesh.model=4"], "model axis 4"),
    # The ESSA paper's GRPO baselines, every weight trained (train.params = "full": masters,
    # AdamW state and base sharded over data): 7B on 8 x H100 and through the TPU compiler; 32B
    # on 16, 32 and 64 x H100 (the smallest that fits is the one to report).
    ("grpo_qwen2p5_7b_gsm8k", GPU8, "paper baseline: 8 x H100, full-parameter"),
    ("grpo_qwen2p5_7b_gsm8k", ["--target", "tpu:v5p:2x2x2"], "full-parameter, TPU compiler"),
    *(
        (
            "grpo_qwen2p5_32b_prm800k",
            ["--devices", str(n), "--device_memory_gb", "80"],
            f"full-parameter: {n} x H100",
        )
        for n in (16, 32, 64)
    ),
    # 32B on 16 x H100 needs the model axis (65.5 GB of weights); its config sets it.
    (
        "essa_qwen2p5_32b_prm800k",
        ["--devices", "16", "--device_memory_gb", "80"],
        "paper: 16 x H100",
    ),
    # The 7B ESSA config on a TPU v5e-16 slice (16 GB per chip), compiled by XLA's TPU compiler.
    # 16 GB chips: the row chunk from the budget (0) and a smaller held-out batch.
    (
        "essa_qwen2p5_7b_gsm8k",
        [
            "--target",
            "tpu:v5e:4x4",
            "--config.mesh.model=4",
            "--config.essa.rows_per_chunk=0",
            "--config.eval.batch_size=100",
        ],
        "TPU v5e-16",
    ),
    # The same 7B programs through XLA's TPU compiler (8 chips of a v5p slice, 95 GB each):
    # exact per-device bytes, next to the CPU compiler's approximation of a GPU's above.
    ("essa_qwen2p5_7b_gsm8k", ["--target", "tpu:v5p:2x2x2"], "cross-check: TPU compiler"),
    ("fgrpo_qwen2p5_7b_deepscaler", ["--target", "tpu:v5p:2x2x2"], "cross-check: TPU compiler"),
    ("essa_smollm2_arith", ["--devices", "1", "--device_memory_gb", "16"], "the default run"),
    ("essa_smollm2_arith", ["--target", "tpu:v5e:2x2"], "TPU compiler, exact bytes"),
)


def run_case(config: str, args: list[str]) -> tuple[list[dict], int, float, str]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "plan.json")
        cmd = [sys.executable, "-m", "essa_jax.plan", "--config", f"{CONFIGS}/{config}.py"]
        t0 = time.perf_counter()
        proc = subprocess.run(
            [*cmd, *args, "--json", out], capture_output=True, text=True, check=False
        )
        wall = time.perf_counter() - t0
        print(proc.stdout, end="")
        print(proc.stderr, end="", file=sys.stderr)
        rows = json.load(open(out)) if os.path.exists(out) else []
        return rows, proc.returncode, wall, proc.stderr.strip().splitlines()[-1:] or [""]


def main() -> None:
    rows, table = [], []
    for config, args, why in CASES:
        plans, rc, wall, last = run_case(config, args)
        if rc not in (0, 1):
            raise SystemExit(f"plan of {config} {' '.join(args)} failed (rc {rc}): {last[0]}")
        overrides = [a for a in args if a.startswith("--config.")]
        for p in plans:
            p["case"] = why
            p["overrides"] = overrides
            rows.append(p)
            table.append(
                {
                    "config": config,
                    "target": p["target"].split(" (")[0],
                    "mesh": "x".join(f"{k}{v}" for k, v in p["mesh"].items()),
                    "program": p["program"],
                    "GB/device": round(p["per_device_bytes"] / 1e9, 2),
                    "of GB": round(p["device_memory_bytes"] / 1e9, 1),
                    "fits": "yes" if p["fits"] else "NO",
                    "chunks": ", ".join(f"{k}={v}" for k, v in p["chunks"].items()),
                }
            )
        print(f"  ({config}: {wall:.0f} s)")
    print_table(table, "ahead-of-time plan (per-device bytes from XLA's buffer assignment)")
    write_results("plan", {"headroom": 0.10, "rows": rows})


if __name__ == "__main__":
    main()
