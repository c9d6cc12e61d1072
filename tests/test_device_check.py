"""benchmarks/device_check.py --smoke: the GPU device check's code path on CPU with tiny shapes,
writing its JSON to a temporary path (never experiments/results)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # a dozen small compiles: about a minute of CPU
def test_device_check_smoke_writes_every_field(tmp_path):
    out = tmp_path / "gpu.json"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    res = subprocess.run(
        [sys.executable, "-m", "benchmarks.device_check", "--smoke", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["smoke"] is True and r["device"]["platform"] == "cpu" and r["skipped"] == []
    assert r["model"] == "random:tiny" and r["num_params"] > 0
    assert r["matmul"]["tflops"] > 0 and r["peak_flops"]["used"] > 0
    assert r["prefill"]["mfu"] > 0 and r["prefill"]["tokens"] == r["settings"]["prompt"]
    assert [d["batch"] for d in r["decode"]] == r["settings"]["decode_batches"]
    assert all({"tokens_per_s", "step_ms", "compile_s"} <= set(d) for d in r["decode"])
    assert [p["P"] for p in r["population"]] == r["settings"]["pops"]
    assert all(
        p["ratio"] > 0 and p["rows"] == p["P"] * p["prompts_per_member"] for p in r["population"]
    )
    mem = r["memory"]
    assert mem["predicted_population_bytes"] > 0
    assert r["memory_program"]["argument_bytes"] > 0
    assert mem["peak_bytes_in_use"] is None  # CPU devices report no memory stats
    assert r["elapsed_s"] > 0
