"""Population generation throughput: ESSA's batched SVD-LoRA engine vs the alternatives.

SmolLM2-135M-Instruct (the embedded GGUF, float32) generates for P members x B prompts, fixed prompt
length and a fixed number of new tokens (greedy, EOS disabled so that every variant does the same
work). Variants, each in its own subprocess so that its peak RSS (ru_maxrss) is its own:

  population   essa_jax.population.population_generate: P*B rows, one program, shared W/U/V,
               per-row singular values (the hot path, docs/ARCHITECTURE.md "Population")
  plain        models.generate on the same P*B rows with no adapter at all (the ceiling)
  merged       jax.vmap over members of (merge W + B'A' into q/k/v/o, generate B rows): the naive
               batched approach, P copies of the adapted kernels
  sequential   Python loop over members: merge (jit), generate B rows (jit), drop the merged kernels
  hf_peft      transformers + peft, one member after another: load the member's LoRA weights with
               set_peft_model_state_dict, HF generate B rows (torch threads = cores); P=8 only

Peak memory includes the process baseline (Python, jax or torch, the model): `baseline_rss_mb` is
the RSS right after loading the model. Timings are min over repeats after one compile/warm-up run.
Greedy tokens of population / merged / sequential are compared (fraction of equal tokens).

What the numbers mean:

- `ratio_vs_plain_p{P}`: population time / plain time, the cost of per-row singular values over no
  adapter at all (target <= 1.10). Measured *interleaved* in one process (one more subprocess per
  P): both programs are compiled and run once, then R rounds (--rounds, default 7) each run both
  back to back in ABBA order (round r even: population then plain; odd: plain then population), so
  that slow drift and any "second of the pair" effect cancel. Round r gives
  ratio_r = t_pop[r] / t_plain[r]; the headline is the median of the ratio_r. A noisy neighbour
  on the shared cores slows both halves of a pair about equally, so a per-round ratio is far less
  noisy than a ratio of two times taken minutes apart in two processes.
- `ratio_interleaved_p{P}`: the details: median, `min_time_ratio` = min(t_pop) / min(t_plain),
  q25 / q75 / iqr of the ratio_r, and the raw per-round times. An IQR that is not small next to
  |median - 1| says the run was too noisy to tell the ratio from 1.
- `ratio_vs_plain_separate_p{P}`: the old number, min time of the population subprocess / min time
  of the plain subprocess (runs minutes apart in different processes; noise enters directly).
- `speedup_vs_{merged,sequential}_p{P}`, `speedup_vs_hf_peft_sequential_p8`: the other variant's
  min time / population's min time, each from its own subprocess (ratios of 2-4x, where the noise
  of separate runs matters less).
- `peak_rss_mb_{variant}_p{P}`: peak RSS of that variant's own subprocess.

Run: `.venv/bin/python -m benchmarks.population` (writes experiments/results/population.json).
Only the interleaved ratio: `.venv/bin/python -m benchmarks.population --only-ratio`; this updates
the ratio keys of an existing results file and keeps the rest (the variants' machine description is
kept as `variants_machine`). `--results PATH` writes elsewhere (smoke tests).

Memory: `.venv/bin/python -m benchmarks.population --memory` (`make bench
SECTION=population_memory`; writes experiments/results/population_memory.json). For population,
plain and merged at each P, in a fresh subprocess: the RSS increase of compiling the variant's
program (`jax.jit(fn).lower(...).compile()` of the very call the variant times, weights as
arguments), XLA's `memory_analysis()` of it (argument / output / temp / generated-code bytes; the
CPU backend reports no generated-code size), the bytes of the stacked layer weights next to the
temp bytes (`temp_over_layer_weights`: generate's decode loop holds a per-layer copy of them), and
the peak RSS increase of one call of the compiled program (merged: P <= 8 only). Sizes, not times:
they do not depend on machine load; the compile's RSS increase does vary from process to process,
so population and plain compile in --memory-repeats processes (default 3) and the spread is kept.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import (
    RESULTS_DIR,
    machine_info,
    peak_rss_mb,
    print_table,
    time_fn,
    write_results,
)

PROMPT_LEN = 32
NEW_TOKENS = 16
PROMPTS_PER_MEMBER = 4
RANK = 8
TARGETS = ("q", "k", "v", "o")
MODEL = "smollm2-135m-instruct"


def _setup(members: int):
    """Model, an SFT-like rank-8 q/k/v/o adapter, SVD basis, genomes [P, D], prompts [P, B, T]."""
    import jax
    import jax.numpy as jnp

    from essa_jax.lora import LoRA, LoraConfig, init_lora, svd_factorize
    from essa_jax.models import load_pretrained

    config, params = load_pretrained(MODEL, dtype=jnp.float32)
    lc = LoraConfig(rank=RANK, alpha=2.0 * RANK, targets=TARGETS)
    lora = init_lora(jax.random.key(0), config, lc)
    rng = np.random.default_rng(0)
    # An SFT adapter has B != 0 (a fresh one has B = 0 and degenerate s_B); small random B.
    lora = {
        t: LoRA(
            a=ad.a,
            b=jnp.asarray(0.02 * rng.standard_normal(ad.b.shape), jnp.float32),
            scale=ad.scale,
        )
        for t, ad in lora.items()
    }
    basis, layout = svd_factorize(lora)
    genomes = jnp.asarray(0.05 * rng.standard_normal((members, layout.size)), jnp.float32)
    # Token ids from the ordinary text range (avoid special tokens), all rows real: fixed lengths.
    tokens = rng.integers(100, 20000, (members, PROMPTS_PER_MEMBER, PROMPT_LEN)).astype(np.int32)
    mask = np.ones_like(tokens)
    return config, params, lc, basis, layout, genomes, tokens, mask


def _program(variant: str, setup: tuple) -> tuple[Callable[..., Any], dict, dict]:
    """The function a jax variant calls, its array arguments and its static ones.

    `fn(**arrays, **static)` is one call of the variant (population, plain, merged); `_runner`
    times exactly that call and `_memory_worker` compiles it with
    `jax.jit(fn, static_argnames=static).lower(**arrays, **static).compile()`, so the weights are
    arguments of the compiled program, not constants folded into it.
    """
    import jax
    import jax.numpy as jnp

    config, params, lc, basis, layout, genomes, tokens, mask = setup
    p, b, t = tokens.shape
    key = jax.random.key(0)
    gen_kw = dict(max_new_tokens=NEW_TOKENS, greedy=True, eos_token_ids=())

    if variant == "population":
        from essa_jax.population import population_generate

        arrays = {
            "params": params,
            "basis": basis,
            "genomes": genomes,
            "prompt_tokens": tokens,
            "prompt_mask": mask,
            "key": key,
        }
        return population_generate, arrays, dict(config=config, layout=layout, **gen_kw)

    if variant == "plain":
        from essa_jax.models import generate_jit

        flat_t, flat_m = jnp.asarray(tokens.reshape(p * b, t)), jnp.asarray(mask.reshape(p * b, t))
        arrays = dict(params=params, prompt_tokens=flat_t, prompt_mask=flat_m, key=key)
        return generate_jit, arrays, dict(config=config, **gen_kw)

    if variant == "merged":
        from essa_jax.lora import merge_lora, svd_lora_to_lora
        from essa_jax.models import generate

        @jax.jit
        def merged(params, basis, genomes, tokens, mask):
            def member(genome, tok, msk):
                merged_params = merge_lora(params, svd_lora_to_lora(basis, layout, genome))
                return generate(merged_params, config, tok, msk, key, **gen_kw).tokens

            return jax.vmap(member)(genomes, tokens, mask)

        arrays = dict(params=params, basis=basis, genomes=genomes, tokens=tokens, mask=mask)
        return merged, arrays, {}

    raise ValueError(f"no single-program form for variant {variant!r}")


def _runner(variant: str, setup: tuple) -> Callable[[], Any]:
    """A no-argument function that generates all P*B rows with `variant` (jax variants only).

    Returns whatever the variant returns: tokens `[P, B, N]` or `[P*B, N]` (N = NEW_TOKENS).
    """
    import jax
    import jax.numpy as jnp

    config, params, lc, basis, layout, genomes, tokens, mask = setup
    p, b, t = tokens.shape
    key = jax.random.key(0)
    gen_kw = dict(max_new_tokens=NEW_TOKENS, greedy=True, eos_token_ids=())

    if variant in ("population", "plain", "merged"):
        fn, arrays, static = _program(variant, setup)

        def run():
            out = fn(**arrays, **static)
            return out if variant == "merged" else out.tokens

    elif variant == "sequential":
        from essa_jax.lora import svd_lora_to_lora
        from essa_jax.models import generate_jit

        @jax.jit
        def merged_kernels(basis, genome):
            lora = svd_lora_to_lora(basis, layout, genome)
            return {
                name: params["layers"][name]["kernel"] + ad.delta_kernel()
                for name, ad in lora.items()
            }

        def run():
            outs = []
            for i in range(p):  # the naive loop this library exists to avoid
                kernels = merged_kernels(basis, genomes[i])
                layers = {**params["layers"]}
                for name, k in kernels.items():
                    layers[name] = {**layers[name], "kernel": k}
                member_params = {**params, "layers": layers}
                outs.append(generate_jit(member_params, config, tokens[i], mask[i], key, **gen_kw))
                del member_params, kernels  # "unmerge": the base params were never modified
            return jnp.stack([o.tokens for o in outs])

    else:
        raise ValueError(f"unknown variant {variant!r}")
    return run


def _worker(variant: str, members: int, repeats: int, out_dir: Path) -> dict:
    """One variant in this (fresh) process: compile + `repeats` timed runs, peak RSS, tokens."""
    setup = _setup(members)
    baseline = peak_rss_mb()
    if variant == "hf_peft":
        config, _, lc, basis, layout, genomes, tokens, _ = setup
        return _hf_worker(members, repeats, out_dir, config, lc, basis, layout, genomes, tokens)
    p, b, _ = setup[6].shape
    run = _runner(variant, setup)
    stats = time_fn(run, repeats=repeats, warmup=1)
    np.save(out_dir / f"{variant}_{members}.npy", np.asarray(run()).reshape(p, b, NEW_TOKENS))
    return {**stats, "baseline_rss_mb": baseline, "peak_rss_mb": peak_rss_mb()}


def _rss_mib() -> tuple[float, float]:
    """(current RSS, peak RSS since the last `_reset_peak_rss`) of this process in MiB."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) / 1024.0  # kB
    return fields["VmRSS"], fields["VmHWM"]


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) to the current RSS; False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _memory_worker(variant: str, members: int, execute: bool) -> dict:
    """XLA's memory analysis and the RSS cost of compiling (and running) one variant's program.

    The program is `jax.jit(fn, static_argnames=...).lower(**arrays, **static).compile()` of the
    very call the variant times (`_program`). RSS is read from /proc/self/status: VmRSS before
    and after each phase and VmHWM (reset before each phase) for the phase's peak.
    """
    import gc

    import jax

    setup = _setup(members)
    config, params = setup[0], setup[1]
    fn, arrays, static = _program(variant, setup)
    jax.block_until_ready(arrays)
    gc.collect()
    leaves = jax.tree.leaves(params["layers"])
    layer_bytes = sum(x.nbytes for x in leaves)
    res: dict[str, Any] = {
        "layer_weights_bytes": layer_bytes,
        "layer_weights_mib": layer_bytes / 2**20,
        "params_bytes": sum(x.nbytes for x in jax.tree.leaves(params)),
        "num_layers": config.num_layers,
        "peak_reset": _reset_peak_rss(),
    }
    rss0, _ = _rss_mib()
    t0 = time.perf_counter()
    compiled = jax.jit(fn, static_argnames=tuple(static)).lower(**arrays, **static).compile()
    res["compile_s"] = time.perf_counter() - t0
    rss1, hwm1 = _rss_mib()
    res.update(
        rss_before_compile_mib=rss0,
        rss_after_compile_mib=rss1,
        compile_rss_increase_mib=rss1 - rss0,
        compile_peak_rss_increase_mib=hwm1 - rss0 if res["peak_reset"] else None,
    )
    stats = compiled.memory_analysis()
    xla = {
        name: int(getattr(stats, name))
        for name in dir(stats)
        if name.endswith("_in_bytes") and isinstance(getattr(stats, name), int)
    }
    res["memory_analysis"] = xla
    temp = xla.get("temp_size_in_bytes", 0)
    res.update(
        temp_mib=temp / 2**20,
        argument_mib=xla.get("argument_size_in_bytes", 0) / 2**20,
        output_mib=xla.get("output_size_in_bytes", 0) / 2**20,
        generated_code_mib=xla.get("generated_code_size_in_bytes", 0) / 2**20,
        temp_over_layer_weights=temp / layer_bytes,
        temp_minus_layer_weights_mib=(temp - layer_bytes) / 2**20,
    )
    if execute:
        _reset_peak_rss()
        rss2, _ = _rss_mib()
        t0 = time.perf_counter()
        out = jax.block_until_ready(compiled(**arrays))
        res["run_s"] = time.perf_counter() - t0
        rss3, hwm3 = _rss_mib()
        del out
        res.update(
            rss_before_run_mib=rss2,
            run_peak_rss_increase_mib=hwm3 - rss2 if res["peak_reset"] else None,
            run_rss_increase_kept_mib=rss3 - rss2,
        )
    res["process_peak_rss_mib"] = peak_rss_mb()
    return res


def _ratio_worker(members: int, rounds: int) -> dict:
    """Population vs plain interleaved in this one process (see "what the numbers mean").

    Both programs are compiled (first call) and run once more before timing, so every timed call
    is a steady-state one. Round r times both back to back, population first when r is even (ABBA
    order), and gives ratio_r = t_pop[r] / t_plain[r].
    """
    from benchmarks.common import block

    setup = _setup(members)
    runs = {v: _runner(v, setup) for v in ("population", "plain")}
    first_call_s = {}
    for v, run in runs.items():
        t0 = time.perf_counter()
        block(run())
        first_call_s[v] = time.perf_counter() - t0
        block(run())  # one steady-state call each: caches and allocator warm for both

    times: dict[str, list[float]] = {"population": [], "plain": []}
    for r in range(rounds):
        order = ("population", "plain") if r % 2 == 0 else ("plain", "population")
        for v in order:
            t0 = time.perf_counter()
            block(runs[v]())
            times[v].append(time.perf_counter() - t0)
    return {"first_call_s": first_call_s, **_ratio_stats(times["population"], times["plain"])}


def _ratio_stats(t_pop: list[float], t_plain: list[float]) -> dict:
    """Median, quartiles and IQR of per-round ratios t_pop[r] / t_plain[r], min-time ratio, raw."""
    ratios = np.asarray(t_pop) / np.asarray(t_plain)
    q25, median, q75 = (float(q) for q in np.percentile(ratios, [25, 50, 75]))
    return {
        "rounds": len(ratios),
        "order": "ABBA: population first in even rounds, plain first in odd rounds",
        "median": median,
        "min_time_ratio": min(t_pop) / min(t_plain),
        "q25": q25,
        "q75": q75,
        "iqr": q75 - q25,
        "ratios": ratios.tolist(),
        "population_s": list(t_pop),
        "plain_s": list(t_plain),
    }


def _hf_worker(members, repeats, out_dir, config, lc, basis, layout, genomes, tokens) -> dict:
    import jax.numpy as jnp
    import peft
    import torch
    import transformers

    from essa_jax.lora import export_peft, peft_tensor_name, svd_lora_to_lora
    from essa_jax.models import smollm2_gguf_path

    torch.set_num_threads(os.cpu_count() or 1)
    path = smollm2_gguf_path()
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    states = []
    for i in range(members):
        lora = svd_lora_to_lora(basis, layout, jnp.asarray(genomes[i]))
        state = {}
        for t, ad in lora.items():
            a, b = np.asarray(ad.a), np.asarray(ad.b)
            for layer in range(a.shape[0]):
                state[peft_tensor_name(layer, t, "A")] = torch.from_numpy(a[layer].copy())
                state[peft_tensor_name(layer, t, "B")] = torch.from_numpy(b[layer].copy())
        states.append(state)
        if i == 0:
            export_peft(out_dir / "hf_adapter", lora, lc)
    model = peft.PeftModel.from_pretrained(hf, str(out_dir / "hf_adapter")).eval()
    baseline = peak_rss_mb()
    pad = config.effective_pad_id

    def run():
        outs = []
        with torch.no_grad():
            for i in range(members):
                peft.set_peft_model_state_dict(model, states[i])
                ids = torch.from_numpy(tokens[i].astype(np.int64))
                out = model.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    do_sample=False,
                    max_new_tokens=NEW_TOKENS,
                    min_new_tokens=NEW_TOKENS,
                    pad_token_id=pad,
                )
                outs.append(out[:, ids.shape[1] :].numpy())
        return np.stack(outs)

    # No compile to amortise: warm up on one member only, then time whole loops (torch's OpenMP
    # threads degrade badly on a shared machine, so each loop is expensive).
    with torch.no_grad():
        ids = torch.from_numpy(tokens[0].astype(np.int64))
        model.generate(input_ids=ids, do_sample=False, max_new_tokens=2, pad_token_id=pad)
    times, out = [], None
    for _ in range(max(1, repeats - 1)):
        t0 = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - t0)
    np.save(out_dir / f"hf_peft_{members}.npy", out)
    stats = {"first_s": times[0], "min_s": min(times), "median_s": sorted(times)[len(times) // 2]}
    return {**stats, "baseline_rss_mb": baseline, "peak_rss_mb": peak_rss_mb()}


def _spawn(variant: str, members: int, repeats: int, out_dir: Path, rounds: int = 0) -> dict:
    """Run `--worker variant` in a fresh subprocess; its RESULT line, or {"error": last line}."""
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.population",
        "--worker",
        variant,
        "--members",
        str(members),
        "--repeats",
        str(repeats),
        "--rounds",
        str(rounds),
        "--out",
        str(out_dir),
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout)[-1500:]
        print(f"[{variant} P={members}] failed (rc={proc.returncode}):\n{tail}", flush=True)
        return {"error": tail.strip().splitlines()[-1] if tail.strip() else f"rc={proc.returncode}"}
    res = json.loads(lines[-1][len("RESULT ") :])
    res["process_wall_s"] = wall
    if variant.startswith("memory-"):
        print(
            f"[{variant} P={members}] compile +{res['compile_rss_increase_mib']:.0f} MiB RSS, "
            f"temp {res['temp_mib']:.0f} MiB ({wall:.0f} s)",
            flush=True,
        )
    elif variant == "ratio":
        print(
            f"[ratio P={members}] median {res['median']:.4f} (IQR {res['iqr']:.4f}, "
            f"min-time {res['min_time_ratio']:.4f}, {res['rounds']} rounds, {wall:.0f} s)",
            flush=True,
        )
    else:
        print(
            f"[{variant} P={members}] {res['min_s']:.3f} s (peak {res['peak_rss_mb']:.0f} MiB)",
            flush=True,
        )
    return res


def _match(out_dir: Path, a: str, b: str, members: int) -> float | None:
    fa, fb = out_dir / f"{a}_{members}.npy", out_dir / f"{b}_{members}.npy"
    if not (fa.exists() and fb.exists()):
        return None
    return float(np.mean(np.load(fa) == np.load(fb)))


def _measure_ratios(sizes: list[int], rounds: int, out_dir: Path) -> tuple[dict, list[dict]]:
    """Interleaved population/plain ratio per P (one subprocess each): summary keys and rows."""
    summary, rows = {}, []
    for p in sizes:
        res = _spawn("ratio", p, 0, out_dir, rounds=rounds)
        summary[f"ratio_interleaved_p{p}"] = res
        if "error" in res:
            summary[f"ratio_vs_plain_p{p}"] = None
            rows.append({"P": p, "median": float("nan"), "note": res["error"][:60]})
            continue
        summary[f"ratio_vs_plain_p{p}"] = res["median"]
        rows.append(
            {
                "P": p,
                "rounds": res["rounds"],
                "median": res["median"],
                "q25": res["q25"],
                "q75": res["q75"],
                "iqr": res["iqr"],
                "min_time_ratio": res["min_time_ratio"],
                "pop_min_s": min(res["population_s"]),
                "plain_min_s": min(res["plain_s"]),
            }
        )
    return summary, rows


MEMORY_VARIANTS = ("population", "plain", "merged")
MEMORY_NOTE = (
    "Memory figures do not depend on machine load: they are sizes, not times (compile_s and run_s "
    "do depend on it and are given only as context). XLA's memory_analysis is the same in every "
    "run; the RSS increase of a compile varies from process to process (allocator arenas, XLA's "
    "compile threads), so population and plain are compiled in `compile_repeats` fresh processes "
    "each and compile_rss_increase_mib_runs / _min / _median / _max give the spread (the first "
    "process also runs the program once)."
)


def _measure_memory(sizes: list[int], out_dir: Path, repeats: int) -> tuple[dict, list[dict]]:
    """`--memory`: one fresh subprocess per (variant, P); results keyed `{variant}_p{P}`, rows.

    Every program is compiled; population and plain are then run once (the run's peak RSS above
    the RSS before it), merged only at P <= 8 (at P = 32 it would hold ~10 GB of merged kernels).
    Population and plain are compiled in `repeats` processes in all (the compile's RSS increase
    varies between processes), merged in one.
    """
    results, rows = {}, []
    for p in sizes:
        for variant in MEMORY_VARIANTS:
            execute = variant != "merged" or p <= 8
            res = _spawn(f"memory-{variant}", p, int(execute), out_dir)
            results[f"{variant}_p{p}"] = res
            if "error" in res:
                rows.append({"variant": variant, "P": p, "note": res["error"][:60]})
                continue
            runs = [res["compile_rss_increase_mib"]]
            for _ in range(repeats - 1 if variant != "merged" else 0):
                more = _spawn(f"memory-{variant}", p, 0, out_dir)
                if "error" not in more:
                    runs.append(more["compile_rss_increase_mib"])
            res.update(
                compile_repeats=len(runs),
                compile_rss_increase_mib_runs=runs,
                compile_rss_increase_mib_min=min(runs),
                compile_rss_increase_mib_median=float(np.median(runs)),
                compile_rss_increase_mib_max=max(runs),
            )
            ma = res["memory_analysis"]
            rows.append(
                {
                    "variant": variant,
                    "P": p,
                    "compile_rss_mib": res["compile_rss_increase_mib"],
                    "compile_peak_mib": res["compile_peak_rss_increase_mib"],
                    "compile_rss_med": res["compile_rss_increase_mib_median"],
                    "compile_rss_min": min(runs),
                    "compile_rss_max": max(runs),
                    "arg_mib": ma.get("argument_size_in_bytes", 0) / 2**20,
                    "out_mib": ma.get("output_size_in_bytes", 0) / 2**20,
                    "temp_mib": res["temp_mib"],
                    "code_mib": res["generated_code_mib"],
                    "layers_mib": res["layer_weights_mib"],
                    "temp/layers": res["temp_over_layer_weights"],
                    "run_peak_mib": res.get("run_peak_rss_increase_mib"),
                    "compile_s": res["compile_s"],
                }
            )
    return results, rows


def _write(results: dict, path: Path | None) -> None:
    """write_results("population", ...) or, with --results, the same payload at `path`."""
    if path is None:
        write_results("population", results)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"machine": machine_info(), **results}
    path.write_text(json.dumps(payload, indent=2, sort_keys=False, default=float) + "\n")
    print(f"wrote {path}")


def _setup_info(rounds: int) -> dict:
    return {
        "model": MODEL,
        "dtype": "float32",
        "rank": RANK,
        "targets": list(TARGETS),
        "prompts_per_member": PROMPTS_PER_MEMBER,
        "prompt_len": PROMPT_LEN,
        "new_tokens": NEW_TOKENS,
        "greedy": True,
        "eos": "disabled",
        "memory": "peak RSS (ru_maxrss) of a fresh subprocess per variant, includes "
        "the process baseline (model loaded) given as baseline_rss_mb",
        "timing": "min over repeats after one compile/warm-up run",
        "ratio_vs_plain": f"median over {rounds} interleaved rounds (ABBA order, one process "
        "holding both compiled programs) of t_population / t_plain; details in "
        "ratio_interleaved_p{P}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--members", type=int, default=8, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=2, help="timed runs (P=8; P=32 uses half)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved population/plain rounds")
    parser.add_argument("--sizes", default="8,32", help="population sizes, comma separated")
    parser.add_argument(
        "--only-ratio",
        action="store_true",
        help="only the interleaved population/plain ratio; updates the ratio keys of the results "
        "file and keeps the rest",
    )
    parser.add_argument(
        "--memory",
        action="store_true",
        help="memory mode: RSS cost of compiling and running, and XLA's memory_analysis, of the "
        "population / plain / merged programs; writes "
        f"{RESULTS_DIR / 'population_memory.json'} (or --results)",
    )
    parser.add_argument(
        "--memory-repeats",
        type=int,
        default=3,
        help="--memory: fresh processes that compile population / plain (RSS spread)",
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        help=f"results JSON path (default {RESULTS_DIR / 'population.json'})",
    )
    args = parser.parse_args()
    if args.worker == "ratio":
        print("RESULT " + json.dumps(_ratio_worker(args.members, args.rounds)), flush=True)
        return
    if args.worker and args.worker.startswith("memory-"):
        res = _memory_worker(args.worker[len("memory-") :], args.members, args.repeats > 0)
        print("RESULT " + json.dumps(res), flush=True)
        return
    if args.worker:
        res = _worker(args.worker, args.members, args.repeats, Path(args.out))
        print("RESULT " + json.dumps(res), flush=True)
        return
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")

    sizes = [int(s) for s in args.sizes.split(",")]
    title = (
        "population generation (SmolLM2-135M f32, greedy, "
        f"{PROMPTS_PER_MEMBER} prompts x {PROMPT_LEN} tokens, {NEW_TOKENS} new tokens)"
    )
    ratio_title = f"population / plain, interleaved in one process ({args.rounds} rounds)"

    if args.memory:
        if args.only_ratio:
            parser.error("--memory and --only-ratio are separate modes")
        if args.memory_repeats < 1:
            parser.error("--memory-repeats must be >= 1")
        with tempfile.TemporaryDirectory() as tmp:
            mem_results, mem_rows = _measure_memory(sizes, Path(tmp), args.memory_repeats)
        print_table(mem_rows, f"memory: {title}")
        first = next((r for r in mem_results.values() if "layer_weights_bytes" in r), {})
        _write(
            {
                "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                "note": MEMORY_NOTE,
                "setup": {
                    **{k: v for k, v in _setup_info(0).items() if k not in ("ratio_vs_plain",)},
                    "units": "MiB = 2**20 bytes (as peak_rss_mb in population.json); XLA's "
                    "figures also in bytes under memory_analysis",
                    "memory": "one fresh subprocess per variant and P; RSS from "
                    "/proc/self/status: compile_rss_increase_mib = VmRSS after - before "
                    "lower().compile(); compile_peak_rss_increase_mib = VmHWM (reset via "
                    "/proc/self/clear_refs before the compile) - VmRSS before; "
                    "run_peak_rss_increase_mib: the same for one call of the compiled "
                    "program; memory_analysis = compiled.memory_analysis() of "
                    "jax.jit(fn).lower(...).compile() of the call the variant times "
                    "(weights are arguments, not constants)",
                    "timing": "compile_s / run_s: one call each, machine load not controlled",
                },
                "layer_weights_bytes": first.get("layer_weights_bytes"),
                "layer_weights_mib": first.get("layer_weights_mib"),
                "params_bytes": first.get("params_bytes"),
                "rows": mem_rows,
                **mem_results,
            },
            args.results or RESULTS_DIR / "population_memory.json",
        )
        return

    if args.only_ratio:
        with tempfile.TemporaryDirectory() as tmp:
            ratio_summary, ratio_rows = _measure_ratios(sizes, args.rounds, Path(tmp))
        print_table(ratio_rows, ratio_title)
        path = args.results or RESULTS_DIR / "population.json"
        previous = json.loads(path.read_text()) if path.exists() else {}
        # The variants (RSS, speedups) were measured by an earlier full run: keep its machine
        # description next to them; the top-level one describes this (ratio) run.
        if "machine" in previous:
            previous["variants_machine"] = previous.pop("machine")
        for p in sizes:
            # A file from before the interleaved measurement holds the separate-process ratio
            # under the headline name: keep it under its own name rather than overwrite it.
            old = previous.get(f"ratio_vs_plain_p{p}")
            if old is not None and f"ratio_interleaved_p{p}" not in previous:
                previous.setdefault(f"ratio_vs_plain_separate_p{p}", old)
        previous.setdefault("setup", {}).update(_setup_info(args.rounds))
        _write({**previous, **ratio_summary}, args.results)
        return

    plan = {
        8: ["population", "plain", "merged", "sequential", "hf_peft"],
        32: ["population", "plain", "merged", "sequential"],
    }
    rows, results = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = Path(tmp)
        ratio_summary, ratio_rows = _measure_ratios(sizes, args.rounds, out_dir)
        for p in sizes:
            repeats = args.repeats if p <= 8 else max(1, args.repeats // 2)
            for variant in plan.get(p, plan[32]):
                res = _spawn(variant, p, repeats, out_dir)
                results[f"{variant}_p{p}"] = res
                if "error" in res:
                    rows.append(
                        {
                            "variant": variant,
                            "P": p,
                            "time_s": float("nan"),
                            "note": res["error"][:60],
                        }
                    )
                    continue
                n_tok = p * PROMPTS_PER_MEMBER * NEW_TOKENS
                rows.append(
                    {
                        "variant": variant,
                        "P": p,
                        "time_s": res["min_s"],
                        "new_tok_per_s": n_tok / res["min_s"],
                        "members_per_s": p / res["min_s"],
                        "peak_rss_mb": res["peak_rss_mb"],
                        "baseline_rss_mb": res["baseline_rss_mb"],
                        "compile_s": res["first_s"] - res["min_s"],
                    }
                )
            for other in ("merged", "sequential", "hf_peft"):
                m = _match(out_dir, "population", other, p)
                if m is not None:
                    results[f"token_match_population_vs_{other}_p{p}"] = m

    def ratio(num: str, den: str) -> float | None:
        a, b = results.get(num, {}), results.get(den, {})
        if "min_s" in a and "min_s" in b:
            return a["min_s"] / b["min_s"]
        return None

    summary = {}
    for p in sizes:
        summary[f"ratio_vs_plain_p{p}"] = ratio_summary[f"ratio_vs_plain_p{p}"]
        summary[f"ratio_vs_plain_separate_p{p}"] = ratio(f"population_p{p}", f"plain_p{p}")
        summary[f"speedup_vs_merged_p{p}"] = ratio(f"merged_p{p}", f"population_p{p}")
        summary[f"speedup_vs_sequential_p{p}"] = ratio(f"sequential_p{p}", f"population_p{p}")
        for v in ("population", "plain", "merged", "sequential", "hf_peft"):
            if "peak_rss_mb" in results.get(f"{v}_p{p}", {}):
                summary[f"peak_rss_mb_{v}_p{p}"] = results[f"{v}_p{p}"]["peak_rss_mb"]
    if 8 in sizes:
        summary["speedup_vs_hf_peft_sequential_p8"] = ratio("hf_peft_p8", "population_p8")
    print_table(rows, title)
    print_table(ratio_rows, ratio_title)
    print_table([{"metric": k, "value": v} for k, v in summary.items()], "summary")
    details = {k: v for k, v in ratio_summary.items() if k.startswith("ratio_interleaved_")}
    _write(
        {
            "setup": _setup_info(args.rounds),
            **summary,
            **details,
            "rows": rows,
            "variants": results,
        },
        args.results,
    )


if __name__ == "__main__":
    main()
