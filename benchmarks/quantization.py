"""Benchmark section `quantization`: ESSA on an int8 / int4 base (SmolLM2-135M, add_2d).

Three ESSA runs of `experiments/configs/essa_smollm2_arith.py` (`train_and_evaluate`), identical
but for `model.quantize` = none / int8 / int4: SFT trains on the float weights in every run (the
same adapter: same seed), then CMA-ES computes every candidate's fitness on that run's base. Each
run gets the same budget, a fixed number of generations (BENCH_QUANT_GENERATIONS, default 20;
max_wall_seconds off), not wall-clock, so a busy machine slows runs but does not shorten them.

Then, on the 200 held-out problems (greedy; the same problems for every row, so every comparison is
paired, exact McNemar against float32):
- the base model, the SFT adapter and the float32 run's ESSA adapter under float32, int8, int4;
- the int8-fitness and int4-fitness runs' ESSA adapters evaluated in float32: their gain over the
  SFT start next to the float32 run's;
- resident bytes of the base weights in each form, and decode tokens/s at batch 64 (32 new
  tokens, EOS ignored; decode = generate(32) - generate(1), min of BENCH_QUANT_REPEATS).

SmolLM2's projections are Q4_1 blocks in its GGUF: "float32" is those blocks dequantised, "int4"
reads them as they are (the same weights: int4 = float32 to float rounding), "int8" requantises
them per output channel (a genuine, if small, loss). Writes experiments/results/quantization.json.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import block, print_table, write_results
from essa_jax import lora as lora_lib
from essa_jax.evaluation import mcnemar_exact
from essa_jax.models import PROJECTIONS, generate_jit
from essa_jax.models.quant import param_bytes
from essa_jax.train import pipeline
from essa_jax.train.sft import train_sft

CONFIG = Path(__file__).resolve().parents[1] / "experiments/configs/essa_smollm2_arith.py"
MODES = ("none", "int8", "int4")
NAMES = {"none": "f32", "int8": "int8", "int4": "int4"}


def _config(mode: str, generations: int):
    spec = importlib.util.spec_from_file_location("essa_smollm2_arith", CONFIG)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    c = module.get_config()
    c.model.quantize = mode
    c.essa.generations = generations
    c.max_wall_seconds = 0.0  # a fixed number of generations: the same budget for every run
    c.eval.every = 0  # the held-out evaluations are done below, paired, for every form
    c.eval.base_model = False
    c.checkpoint.every = 0
    return c


def _solved(ev: dict) -> list[int]:
    return [int(ch) for ch in ev["solved"]]


def _decode_tokens_per_s(params, mc, tokens, mask, repeats: int) -> dict[str, float]:
    """Decode tokens/s of `generate_jit` at this batch: (generate(N) - generate(1)) / (N - 1)."""
    n = 32
    key = jax.random.PRNGKey(0)
    kw = dict(greedy=True, eos_token_ids=(), pad_token_id=mc.effective_pad_id)

    def run(new: int) -> float:
        block(generate_jit(params, mc, tokens, mask, key, max_new_tokens=new, **kw))  # compile
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            block(generate_jit(params, mc, tokens, mask, key, max_new_tokens=new, **kw))
            best = min(best, time.perf_counter() - t0)
        return best

    full, one = run(n), run(1)
    decode_s = max(full - one, 1e-9)
    return {
        "decode_tokens_per_s": tokens.shape[0] * (n - 1) / decode_s,
        "generate_s": full,
    }


def main() -> None:
    generations = int(os.environ.get("BENCH_QUANT_GENERATIONS", "20"))
    repeats = int(os.environ.get("BENCH_QUANT_REPEATS", "2"))
    root = os.environ.get("BENCH_QUANT_WORKDIR") or tempfile.mkdtemp(prefix="bench_quant_")
    t_start = time.perf_counter()

    # 1. The three ESSA runs.
    runs = {}
    for mode in MODES:
        c = _config(mode, generations)
        workdir = os.path.join(root, NAMES[mode])
        t0 = time.perf_counter()
        if os.path.exists(os.path.join(workdir, "summary.json")):  # a rerun reuses a finished run
            s = pipeline.load_summary(workdir)
        else:
            s = pipeline.train_and_evaluate(c, workdir, resume=False, verbose=True)
        runs[mode] = {
            "summary": s,
            "workdir": workdir,
            "seconds": time.perf_counter() - t0,
        }
        print(
            f"ESSA run, fitness on {NAMES[mode]}: SFT {s['sft_heldout_acc']:.3f} -> "
            f"{s['final_heldout_acc']:.3f} (own base) in {s['steps']} generations, "
            f"{s['train_wall_seconds']:.0f}s loop",
            flush=True,
        )

    # 2. Every adapter under every form, on the same held-out problems.
    c = _config("none", generations)
    run = pipeline.build_run(c, os.path.join(root, "eval"), verbose=False)
    mc = run.model_config
    k_sft, _ = jax.random.split(jax.random.PRNGKey(c.seed))  # the pipeline's SFT key
    lora0 = lora_lib.init_lora(k_sft, mc, run.lora_config, jnp.float32)
    sft = train_sft(
        lora0,
        run.params,
        mc,
        run.train,
        c.sft,
        seed=c.seed,
        pad_id=run.sampler.pad_token_id,
        remat=bool(c.model.remat),
        mesh=run.mesh,
    )
    essa = {
        mode: lora_lib.import_peft(os.path.join(runs[mode]["workdir"], "adapter"), mc)[1]
        for mode in MODES
    }
    bases = {}
    for mode in MODES:
        cm = _config(mode, generations)
        bases[mode] = pipeline.quantized_base(cm, mc, run.params)

    def evaluate(mode: str, lora) -> dict:
        run.infer_params = bases[mode]
        ev = pipeline.evaluate_policy(run, lora)
        return {"acc": ev["acc"], "ci": [ev["ci_low"], ev["ci_high"]], "solved": ev["solved"]}

    policies = {"base": None, "sft": sft, "essa": essa["none"]}
    table = []
    accuracy = {}
    for name, lora in policies.items():
        evs = {mode: evaluate(mode, lora) for mode in MODES}
        row = {"policy": name}
        for mode in MODES:
            row[f"{NAMES[mode]}_acc"] = evs[mode]["acc"]
            if mode != "none":
                p = mcnemar_exact(_solved(evs["none"]), _solved(evs[mode]))
                row[f"{NAMES[mode]}_vs_f32_p"] = p["p_value"]
                row[f"{NAMES[mode]}_fixed_broken"] = f"{p['fixed']}/{p['broken']}"
        accuracy[name] = {**row, "evals": evs}
        table.append(row)
        print(row, flush=True)

    sft_f32 = accuracy["sft"]["evals"]["none"]
    fitness_rows = []
    fitness = {}
    for mode in MODES:
        ev = accuracy["essa"]["evals"]["none"] if mode == "none" else evaluate("none", essa[mode])
        paired = mcnemar_exact(_solved(sft_f32), _solved(ev))
        s = runs[mode]["summary"]
        row = {
            "fitness_on": NAMES[mode],
            "sft_f32_acc": sft_f32["acc"],
            "essa_f32_acc": ev["acc"],
            "gain_f32": ev["acc"] - sft_f32["acc"],
            "gain_p": paired["p_value"],
            "essa_own_base_acc": s["final_heldout_acc"],
            "generations": s["steps"],
            "loop_s": s["train_wall_seconds"],
        }
        if mode != "none":
            vs = mcnemar_exact(_solved(accuracy["essa"]["evals"]["none"]), _solved(ev))
            row["vs_f32_run_p"] = vs["p_value"]
        fitness[NAMES[mode]] = {**row, "eval": ev, "run_summary": s}
        fitness_rows.append(row)
        print(row, flush=True)

    # 3. Bytes and decode speed of each form.
    data = run.heldout
    idx = np.arange(64) % len(data)
    tokens, mask = jnp.asarray(data.tokens[idx]), jnp.asarray(data.mask[idx])
    speed_rows = []
    speed = {}
    for mode in MODES:
        p = bases[mode]
        row = {
            "weights": NAMES[mode],
            "param_bytes": param_bytes(p),
            "projection_bytes": param_bytes({k: p["layers"][k] for k in PROJECTIONS}),
            **_decode_tokens_per_s(p, mc, tokens, mask, repeats),
        }
        speed[NAMES[mode]] = row
        speed_rows.append(row)
        print(row, flush=True)

    print_table(table, "held-out accuracy (greedy) per base form; p: exact McNemar vs f32")
    print_table(fitness_rows, "ESSA with fitness on f32 / int8 / int4, adapters evaluated in f32")
    print_table(speed_rows, "resident base bytes and decode tokens/s at batch 64 (32 new tokens)")
    essa_row = accuracy["essa"]
    write_results(
        "quantization",
        {
            "date": time.strftime("%Y-%m-%d"),
            "config": "experiments/configs/essa_smollm2_arith.py",
            "task": c.task.name,
            "heldout_n": len(data),
            "essa_generations": generations,
            "f32_acc": essa_row["f32_acc"],
            "int8_acc": essa_row["int8_acc"],
            "int4_acc": essa_row["int4_acc"],
            "f32_param_bytes": speed["f32"]["param_bytes"],
            "int8_param_bytes": speed["int8"]["param_bytes"],
            "int4_param_bytes": speed["int4"]["param_bytes"],
            "accuracy": accuracy,
            "fitness_runs": fitness,
            "speed": speed,
            "cpu_load_1min_at_end": os.getloadavg()[0],
            "total_seconds": time.perf_counter() - t_start,
            "workdir": root,
        },
    )


if __name__ == "__main__":
    main()
