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
    assert r["errors"] == {}
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


def test_device_check_records_a_failing_section_and_goes_on(tmp_path, monkeypatch):
    """A first run on a new chip or JAX version must not lose the sections that worked: a section
    that raises becomes one line in `errors`, the rest still run, the JSON is written, exit 1."""
    import essa_jax.models

    monkeypatch.syspath_prepend(str(ROOT))  # benchmarks/ is not an installed package
    from benchmarks import device_check

    def broken(*args, **kwargs):
        raise RuntimeError("no kernel for this chip")

    monkeypatch.setattr(essa_jax.models, "generate_jit", broken)
    out = tmp_path / "gpu.json"
    assert device_check.main(["--smoke", "--out", str(out)]) == 1
    r = json.loads(out.read_text())
    failed = {"decode_b2", "decode_b4", "population_p2", "population_p4"}
    assert set(r["errors"]) == failed
    assert all(v == "RuntimeError: no kernel for this chip" for v in r["errors"].values())
    assert r["prefill"]["mfu"] > 0 and r["matmul"]["tflops"] > 0  # the sections that worked
    assert r["decode"] == [] and r["population"] == [] and "memory" in r


def test_device_check_sh_unpacks_wheels_with_namespace_packages(tmp_path):
    """The wheels that travel to a GPU machine are unpacked, not imported from their zips:
    zipimport cannot load a namespace package (qwix's `qwix._src` has no __init__.py), which is
    what stopped the script in a fresh venv holding only jax, jaxlib and numpy."""
    import zipfile

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "nspkg-1.0-py3-none-any.whl", "w") as z:
        z.writestr("nspkg/__init__.py", "from nspkg._src import mod\n")
        z.writestr("nspkg/_src/mod.py", "VALUE = 42\n")
    # A stand-in interpreter: extracting runs the real one; the check itself imports the package.
    shim = tmp_path / "python"
    shim.write_text(
        "#!/bin/sh\n"
        f'if [ "$2" = zipfile ]; then exec {sys.executable} "$@"; fi\n'
        f"exec {sys.executable} -c 'import nspkg; print(nspkg.mod.VALUE)'\n"
    )
    shim.chmod(0o755)
    env = {**os.environ, "ESSA_WHEELS": str(wheels), "PYTHON": str(shim), "TMPDIR": str(tmp_path)}
    res = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "device_check.sh")],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "42"


def test_smoke_without_out_writes_a_temporary_file_not_the_recorded_result(tmp_path):
    """`--smoke` without `--out` must never replace experiments/results/gpu.json (the README's GPU
    measurement) with a tiny model's CPU figures (issue #31): it writes to the temporary folder.
    `--budget_s 0` skips every section, so only the write path runs."""
    recorded = ROOT / "experiments" / "results" / "gpu.json"
    before = recorded.read_bytes() if recorded.exists() else None
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [sys.executable, "-m", "benchmarks.device_check", "--smoke", "--budget_s", "0"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    out = tmp_path / "essa_jax_device_check_smoke.json"
    assert f"wrote {out}" in res.stderr
    assert json.loads(out.read_text())["smoke"] is True
    assert (recorded.read_bytes() if recorded.exists() else None) == before
