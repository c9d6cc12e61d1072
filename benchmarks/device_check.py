"""Device check: what this library does on one accelerator, in under 8 minutes.

    python -m benchmarks.device_check                       # GPU: Qwen2.5-1.5B shape, bf16
    python -m benchmarks.device_check --model Qwen2.5-7B
    python -m benchmarks.device_check --smoke --out /tmp/gpu.json   # CPU, tiny shapes, seconds

A random-weight model of a public checkpoint's shape (`essa_jax.models.shapes`; no checkpoint
travels), bf16 on an accelerator (float32 with --smoke). It measures, each with one warm-up call
(the compile) and the best of `--repeats` timed calls:

- matmul: the best bf16 rate of an n x n x n matmul, next to the chip's published dense bf16 peak
  (`PEAK_BF16`, by device kind; unknown chips fall back to the measured rate);
- prefill: one prompt pass of `prefill_batch` x `prompt` tokens (the pass `generate` runs before
  its decode loop, last-position logits), MFU = its useful FLOPs (`benchmarks.model.
  prefill_flops`) / time / published peak;
- decode: tokens/s at batch 64 / 256 / 1024, from generate(n) - generate(1) (greedy, no EOS, so
  every row decodes n tokens): (n - 1) x batch / that difference;
- population ratio: `population.population_generate` (P members x B prompts in one program, per
  row singular values of a rank-8 q/k/v/o SVD-LoRA) over plain `models.generate_jit` of the same
  P x B rows without an adapter, at P = 32 and 96 (the cost of the members, ESSA Sec. 3);
- memory: the device's peak bytes in use (`memory_stats()["peak_bytes_in_use"]`, the whole
  process) next to what the plan's accounting predicts for the largest program, P = 96's
  population: XLA's buffer assignment of that compiled program (arguments + outputs +
  temporaries - aliased; `essa_jax.plan` reads the same `memory_analysis`) plus the arrays the
  process holds besides the program's arguments.

Writes experiments/results/gpu.json (or --out; a --smoke run without --out writes
essa_jax_device_check_smoke.json in the temporary directory, never over a recorded GPU result),
again after every section, so a run stopped
part-way still leaves what it measured. A section that would run past `--budget_s` is skipped and
named in `skipped`; a section that raises (a first run on a new chip or JAX version) is recorded
in `errors` as one line and the others still run (the exit status is then 1). On CPU,
memory_stats is None and the peak is null.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "experiments" / "results" / "gpu.json"
SMOKE_OUT_NAME = "essa_jax_device_check_smoke.json"

# Dense (no sparsity) bf16 peaks from the vendors' datasheets, by a substring of device_kind.
PEAK_BF16 = {
    "H200": 989e12,  # NVIDIA H200 SXM datasheet
    "H100": 989e12,  # NVIDIA H100 SXM5 datasheet (PCIe: 756e12)
    "A100": 312e12,  # NVIDIA A100 datasheet
    "L4": 121e12,  # NVIDIA L4 datasheet
    "TPU v5 lite": 197e12,  # Google Cloud TPU v5e
}

FULL = dict(
    model="Qwen2.5-1.5B", prompt=128, new=64, prefill_batch=32, decode_batches=(64, 256, 1024),
    pops=(32, 96), prompts_per_member=8, pop_prompt=64, pop_new=32, matmul_n=8192,
)  # fmt: skip
SMOKE = dict(
    model="random:tiny", prompt=8, new=4, prefill_batch=2, decode_batches=(2, 4),
    pops=(2, 4), prompts_per_member=2, pop_prompt=8, pop_new=4, matmul_n=128,
)  # fmt: skip


def _best(fn, repeats: int) -> tuple[float, float]:
    """(first call seconds, best of `repeats` further calls); blocks on the result each time."""
    import jax

    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    first = time.perf_counter() - t0
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t0)
    return first, best


def _model(name: str, dtype: Any):
    import jax

    from essa_jax.models import init_params
    from essa_jax.models.shapes import model_shape
    from essa_jax.models.tiny import tiny_model

    if name.startswith("random:"):
        return tiny_model(name.split(":", 1)[1], dtype=dtype)
    config = model_shape(name)
    params = jax.jit(lambda k: init_params(k, config, dtype))(jax.random.key(0))
    return config, params


def _tokens(rng, shape: tuple[int, ...], vocab: int):
    import jax.numpy as jnp

    # ordinary ids, every slot real (fixed lengths: every row does the same work)
    hi = min(vocab, 20000)
    tokens = rng.integers(min(100, hi - 1), hi, shape).astype("int32")
    return jnp.asarray(tokens), jnp.ones(shape, jnp.int32)


def output_path(out: str | None, smoke: bool) -> Path:
    """Where the JSON goes: `out`, else DEFAULT_OUT for a real check and a file in the temporary
    directory for a smoke run (README: experiments/results/gpu.json holds a GPU measurement)."""
    if out:
        return Path(out)
    return Path(tempfile.gettempdir()) / SMOKE_OUT_NAME if smoke else DEFAULT_OUT


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on any backend (CI)")
    ap.add_argument("--model", default=None, help="a shape of essa_jax.models.shapes")
    ap.add_argument(
        "--out",
        default=None,
        help=f"JSON path (default {DEFAULT_OUT}; with --smoke, {SMOKE_OUT_NAME} in the temporary "
        "directory: a smoke run's CPU figures never replace a recorded GPU result)",
    )
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--budget_s", type=float, default=420.0, help="skip sections past this")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()

    import jax
    import jax.numpy as jnp
    import numpy as np

    from benchmarks.model import prefill_flops
    from essa_jax.lora import LoRA, LoraConfig, init_lora, svd_factorize
    from essa_jax.models import generate_jit, lm_head, prefill
    from essa_jax.models.generate import decode_layers
    from essa_jax.population import population_generate

    s = dict(SMOKE if args.smoke else FULL)
    if args.model:
        s["model"] = args.model
    repeats = args.repeats or (1 if args.smoke else 3)
    dev = jax.devices()[0]
    accel = dev.platform != "cpu"
    dtype = jnp.bfloat16 if accel else jnp.float32
    out_path = output_path(args.out, args.smoke)
    result: dict[str, Any] = {
        "smoke": args.smoke,
        "device": {"platform": dev.platform, "kind": dev.device_kind, "count": jax.device_count()},
        "jax": jax.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model": s["model"],
        "dtype": jnp.dtype(dtype).name,
        "settings": {k: v for k, v in s.items() if k != "model"},
        "skipped": [],
        "errors": {},
    }
    rng = np.random.default_rng(0)

    def over_budget(section: str) -> bool:
        if time.perf_counter() - t_start > args.budget_s:
            result["skipped"].append(section)
            return True
        return False

    def write() -> None:
        result["elapsed_s"] = time.perf_counter() - t_start
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(result, indent=1, default=float) + "\n")

    @contextlib.contextmanager
    def section(name: str):
        """Run one section; an exception becomes one line in `errors`, the JSON is rewritten."""
        try:
            yield
        except Exception as e:  # noqa: BLE001 - a measurement run records and goes on
            result["errors"][name] = f"{type(e).__name__}: {e}"[:2000]
            print(f"device_check: section {name} failed: {type(e).__name__}: {e}", file=sys.stderr)
        write()

    # -- matmul rate and the chip's peak ------------------------------------------------------
    # The peak MFU is taken against: the published one, else this rate (no MFU if neither).
    peak = next((v for k, v in PEAK_BF16.items() if k in dev.device_kind), None)
    result["peak_flops"] = {
        "published_bf16": peak,
        "used": peak,
        "source": "published" if peak else "measured (unknown device kind)",
    }
    with section("matmul"):
        n = s["matmul_n"]
        a = jax.random.normal(jax.random.key(1), (n, n), dtype)
        mm = jax.jit(lambda a: a @ a)
        _, t = _best(lambda: mm(a), repeats)
        result["matmul"] = {"n": n, "tflops": 2 * n**3 / t / 1e12}
        if not peak:
            result["peak_flops"]["used"] = 2 * n**3 / t
    peak = result["peak_flops"]["used"]

    config, params = _model(s["model"], dtype)
    result["num_params"] = int(config.num_params())
    # The layer scan: the decode path `generate` takes on accelerators (and here on CPU too, so
    # the smoke run exercises that path).
    with decode_layers("scan"):
        # -- prefill MFU ------------------------------------------------------------------------
        with section("prefill"):
            if not over_budget("prefill"):
                b, tp = s["prefill_batch"], s["prompt"]
                tok, msk = _tokens(rng, (b, tp), config.vocab_size)

                @jax.jit
                def prompt_pass(params, tokens, mask):
                    h, cache = prefill(
                        params, config, tokens, max_len=tp + s["new"], attention_mask=mask
                    )
                    return lm_head(params, config, h[:, -1]), cache

                first, t = _best(lambda: prompt_pass(params, tok, msk), repeats)
                flops = prefill_flops(config, b, tp)
                result["prefill"] = {
                    "batch": b, "tokens": tp, "seconds": t, "compile_s": first,
                    "tflops": flops / t / 1e12, "mfu": flops / t / peak if peak else None,
                }  # fmt: skip

        # -- decode tokens/s --------------------------------------------------------------------
        result["decode"] = []
        for b in s["decode_batches"]:
            with section(f"decode_b{b}"):
                if over_budget(f"decode_b{b}"):
                    continue
                tok, msk = _tokens(rng, (b, s["prompt"]), config.vocab_size)

                def gen(k, tok=tok, msk=msk):
                    return lambda: generate_jit(
                        params, config, tok, msk, jax.random.key(0),
                        max_new_tokens=k, greedy=True, eos_token_ids=(),
                    ).tokens  # fmt: skip

                c1, t1 = _best(gen(1), repeats)
                cn, tn = _best(gen(s["new"]), repeats)
                steps = s["new"] - 1
                dt = tn - t1  # <= 0 only when timing noise exceeds the decode (tiny smoke shapes)
                result["decode"].append({
                    "batch": b, "new_tokens": s["new"], "prompt": s["prompt"],
                    "tokens_per_s": b * steps / dt if dt > 0 else None,
                    "step_ms": 1e3 * dt / steps, "generate_s": tn, "compile_s": c1 + cn,
                })  # fmt: skip

        # -- population vs plain generation -------------------------------------------------------
        lc = LoraConfig(rank=8, alpha=16.0, targets=("q", "k", "v", "o"))
        lora = init_lora(jax.random.key(2), config, lc)
        lora = {  # an SFT-like adapter: B != 0 (a fresh one has B = 0 and degenerate s_B)
            t: LoRA(
                a=ad.a, b=0.02 * jax.random.normal(jax.random.key(3), ad.b.shape), scale=ad.scale
            )
            for t, ad in lora.items()
        }
        basis, layout = svd_factorize(lora)
        result["population"] = []
        prog_bytes = None
        for p in s["pops"]:
            with section(f"population_p{p}"):
                if over_budget(f"population_p{p}"):
                    continue
                bpm, tp, new = s["prompts_per_member"], s["pop_prompt"], s["pop_new"]
                tok, msk = _tokens(rng, (p, bpm, tp), config.vocab_size)
                genomes = jnp.asarray(0.05 * rng.standard_normal((p, layout.size)), jnp.float32)
                kw = dict(max_new_tokens=new, greedy=True, eos_token_ids=())
                flat_t, flat_m = tok.reshape(p * bpm, tp), msk.reshape(p * bpm, tp)

                def pop_call(genomes=genomes, tok=tok, msk=msk, kw=kw):
                    return population_generate(
                        params, config, basis, layout, genomes, tok, msk, jax.random.key(0), **kw
                    ).tokens

                def plain_call(flat_t=flat_t, flat_m=flat_m, kw=kw):
                    return generate_jit(
                        params, config, flat_t, flat_m, jax.random.key(0), **kw
                    ).tokens

                cp, t_pop = _best(pop_call, repeats)
                cq, t_plain = _best(plain_call, repeats)
                result["population"].append({
                    "P": p, "prompts_per_member": bpm, "rows": p * bpm, "prompt": tp,
                    "new_tokens": new, "population_s": t_pop, "plain_s": t_plain,
                    "ratio": t_pop / t_plain, "compile_s": cp + cq,
                })  # fmt: skip
                if p == max(s["pops"]):
                    # What the plan's accounting predicts for this program (essa_jax.plan reads
                    # the same memory_analysis): the compiled program's own buffers.
                    static = ("config", "layout", "max_new_tokens", "greedy", "eos_token_ids")
                    m = (
                        jax.jit(population_generate, static_argnames=static)
                        .lower(
                            params, config, basis, layout, genomes, tok, msk, jax.random.key(0),
                            **kw,
                        )
                        .compile()
                        .memory_analysis()
                    )  # fmt: skip
                    prog_bytes = (
                        m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
                        - m.alias_size_in_bytes
                    )  # fmt: skip
                    result["memory_program"] = {
                        "argument_bytes": int(m.argument_size_in_bytes),
                        "output_bytes": int(m.output_size_in_bytes),
                        "temp_bytes": int(m.temp_size_in_bytes),
                        "alias_bytes": int(m.alias_size_in_bytes),
                        "predicted_bytes": int(prog_bytes),
                    }

    with section("memory"):
        stats = jax.devices()[0].memory_stats() or {}
        peak_bytes = int(stats["peak_bytes_in_use"]) if "peak_bytes_in_use" in stats else None
        result["memory"] = {
            "peak_bytes_in_use": peak_bytes,
            "bytes_in_use_at_end": stats.get("bytes_in_use"),
            "bytes_limit": stats.get("bytes_limit"),
            "predicted_population_bytes": prog_bytes,
            "peak_over_predicted": (peak_bytes / prog_bytes) if peak_bytes and prog_bytes else None,
            "note": (
                "peak_bytes_in_use is the process's maximum over every program run (the model's "
                "weights included); predicted_population_bytes is XLA's buffer assignment of the "
                "largest program (P = max), weights included as its arguments."
            ),
        }
    print(json.dumps(result, indent=1, default=float))
    print(f"wrote {out_path}", file=sys.stderr)
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
