"""One GRPO step (rollout + update) on SmolLM2-135M-Instruct: essa_jax vs TRL, with LoRA and with
full-parameter training.

Same run, same settings on both sides: 4 prompts x group 4 = 16 rollouts, 16 new tokens, T = 1.0,
token-mean ("dapo") aggregation, clip 0.2, beta = 0 (no reference model), one AdamW update
(lr 1e-6) per step on all 16 rollouts, float32, the same chat-templated prompts and the same host
reward function. What is trained (`--params`, default both, one after the other):
  * lora: LoRA rank 8 / alpha 16 on q, k, v, o (ours: `lora_policy`; TRL: a peft LoraConfig);
  * full: every weight, 134.5M (ours: `train.params = "full"`, `lora.full.full_policy`, float32
    masters and AdamW state; TRL: GRPOTrainer with no peft_config, float32 model and AdamW).

Every (params, side) runs in its own process pinned to the same one core, so each side's peak
resident memory (`*_peak_rss_mb`, ru_maxrss of that process: weights, optimiser state,
activations, and for ours XLA's compiled programs) is its own.

Timing:
  * ours: wall time of `GRPOTrainer.step` (compiled; the first, compiling step is reported
    separately as ours_first_step_s). rollout = generation + decode + reward (+ scoring), update =
    the jitted optax step(s), both from the step's own metrics.
  * TRL (PyTorch CPU, GRPOTrainer): step = a TrainerCallback's on_step_begin -> on_step_end
    (covers `training_step` and the optimizer step); rollout = time inside
    `_generate_and_score_completions` (generation, reward, advantages; wrapped on the instance);
    update = step - rollout; generate = time inside `_generate` alone. The first step (warm-up)
    is dropped; medians of the rest.

    python -m benchmarks.grpo                    # both, -> experiments/results/grpo_step.json
    python -m benchmarks.grpo --params full --out /tmp/grpo_full   # a result file elsewhere
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from benchmarks.common import peak_rss_mb, print_table, write_results

NUM_PROMPTS = 4
GROUP = 4
NEW_TOKENS = 16
RANK, ALPHA = 8, 16.0
TARGETS = ("q", "k", "v", "o")
LR = 1e-6
STEPS = 3  # per side; the first is dropped (compile / warm-up)
# Threads per side (env GRPO_BENCH_THREADS, default 1). On a shared 2-core machine torch's OpenMP
# threads spin against other processes (HF generate here: 112 s with 2 threads vs 22 s with 1), so
# by default the process is pinned to one core (both sides) for a comparison that survives
# contention.
THREADS = int(os.environ.get("GRPO_BENCH_THREADS", "1"))
PROBLEMS = [(23, 45), (7, 8), (61, 19), (34, 52)]


def _prompts(tok) -> tuple[list[str], list[str]]:
    texts, answers = [], []
    for a, b in PROBLEMS[:NUM_PROMPTS]:
        msgs = [{"role": "user", "content": f"What is {a} + {b}? Answer with just the number."}]
        texts.append(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))
        answers.append(str(a + b))
    return texts, answers


def reward_fn(prompts, completions, answer, **_):
    """1.0 when the first integer of the completion is the answer (same function for both)."""
    out = []
    for c, a in zip(completions, answer, strict=True):
        text = c if isinstance(c, str) else c[0]["content"]
        m = re.search(r"-?\d+", text)
        out.append(float(m is not None and m.group(0) == a))
    return out


def compute_bound(
    config, prompt_len: int, new_tokens: int, gflops: float, *, full: bool = False
) -> dict[str, float]:
    """The step's matmul FLOPs and the seconds they take at `gflops` (dense f32 matmul rate
    measured in this run, on the cores the sides run on): a lower bound on either side's step.

    Rollout: the prompt pass over all rows x prompt_len slots (lm_head on the last position only)
    and new_tokens - 1 decode steps over all rows (every row decodes until the last finishes).
    Update (no remat): forward + the backward's input gradients, 2 x 2 x layer weights per token
    (the LoRA factors' own products are ~1% and left out), and the lm_head on the completion only,
    run three times (forward, the chunk's recomputation, its backward). `full` (every weight
    trained) adds the weight gradients: another 2 x layer weights per token over the whole
    sequence (every position's activations reach the loss through attention) and one more lm_head
    product on the completion (the tied head's kernel gradient).
    Attention's products are ~2% at these lengths and left out, so the bound is a lower one.
    """
    c = config
    dq, dkv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    d, inter = c.hidden_size, c.intermediate_size
    layer = c.num_layers * (d * (dq + 2 * dkv) + dq * d + 3 * d * inter)
    head = c.hidden_size * c.vocab_size
    rows = NUM_PROMPTS * GROUP
    passes, head_passes = (3, 4) if full else (2, 3)
    rollout = 2 * rows * (prompt_len * layer + head) + 2 * rows * (new_tokens - 1) * (layer + head)
    update = (
        passes * 2 * rows * (prompt_len + new_tokens) * layer
        + head_passes * 2 * rows * new_tokens * head
    )
    return {
        "matmul_gflops": gflops,
        "rollout_gflop": rollout / 1e9,
        "update_gflop": update / 1e9,
        "rollout_bound_s": rollout / 1e9 / gflops,
        "update_bound_s": update / 1e9 / gflops,
    }


def copy_gbps(mib: int = 512) -> float:
    """Measured memory bandwidth of this core (GB/s of bytes read + written by a numpy copy of
    `mib` MiB, best of 5): what bounds AdamW, which does ~1 FLOP per byte."""
    a = np.ones(mib * 2**20 // 4, np.float32)
    b = np.empty_like(a)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
    return 2 * a.nbytes / best / 1e9


def optimizer_bound(num_weights: int, gbps: float) -> dict[str, float]:
    """The AdamW step's memory traffic over every trained float32 weight and its lower bound at
    `gbps`: read the master, its gradient, m and v, write the master, m and v (7 x 4 bytes per
    weight; Loshchilov & Hutter 2019, arXiv 1711.05101, Alg. 2, one fused pass)."""
    traffic = 7 * 4 * num_weights
    return {"optimizer_gb": traffic / 1e9, "optimizer_bound_s": traffic / 1e9 / gbps}


def bench_ours(texts: list[str], answers: list[str], params_mode: str) -> dict[str, Any]:
    import jax

    from essa_jax.lora import LoraConfig, init_lora, lora_policy
    from essa_jax.lora.full import full_policy, merge_weights
    from essa_jax.models import load_pretrained, load_tokenizer, pad_left
    from essa_jax.rl import FrozenPolicy, GRPOConfig, GRPOTrainer

    config, params = load_pretrained("smollm2-135m-instruct")
    tok = load_tokenizer("smollm2-135m-instruct")
    ids = [tok.encode(t, add_special_tokens=False) for t in texts]
    prompt_tokens, prompt_mask = pad_left(ids, config.effective_pad_id)
    cfg = GRPOConfig(
        group_size=GROUP,
        loss="grpo",
        eps_low=0.2,
        eps_high=0.2,
        agg="token_mean",
        beta=0.0,
        learning_rate=LR,
        weight_decay=0.0,
        max_new_tokens=NEW_TOKENS,
        temperature=1.0,
    )
    if params_mode == "full":  # the run's train.params = "full" (train/grpo.py)
        trainable, frozen, to_lora = full_policy(params)
        to_params = merge_weights
    else:
        lora = init_lora(
            jax.random.key(0), config, LoraConfig(rank=RANK, alpha=ALPHA, targets=TARGETS)
        )
        trainable, frozen, to_lora = lora_policy(lora)
        to_params = None
    trainer = GRPOTrainer(
        config,
        cfg,
        to_lora=to_lora,
        to_params=to_params,
        reward_fn=reward_fn,
        decode=lambda t: tok.decode(t, skip_special_tokens=True),
    )
    state = trainer.init(trainable, jax.random.key(0))
    trained = sum(x.size for x in jax.tree.leaves(state.params))
    policy = FrozenPolicy(params, frozen)
    steps = []
    for _ in range(STEPS):
        t0 = time.perf_counter()
        state, m = trainer.step(state, policy, prompt_tokens, prompt_mask, texts, answer=answers)
        m["wall_s"] = time.perf_counter() - t0
        steps.append(m)
    rest = steps[1:]
    med = lambda k: statistics.median(s[k] for s in rest)  # noqa: E731
    return {
        "first_step_s": steps[0]["wall_s"],
        "step_s": med("wall_s"),
        "rollout_s": statistics.median(s["rollout_s"] + s["reward_s"] + s["score_s"] for s in rest),
        "generate_s": med("rollout_s"),
        "update_s": med("update_s"),
        "completion_len": med("completion_len_mean"),
        "reward_mean": float(np.mean([s["reward_mean"] for s in steps])),
        "trained_numbers": int(trained),
        "prompt_len": int(prompt_tokens.shape[1]),
        "peak_rss_mb": peak_rss_mb(),
    }


def bench_trl(texts: list[str], answers: list[str], params_mode: str) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig as PeftLoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig as TrlGRPOConfig
    from trl import GRPOTrainer as TrlGRPOTrainer

    from essa_jax.models import smollm2_gguf_path

    gguf = smollm2_gguf_path()
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    # transformers dequantises GGUF into plain float32 nn.Linear weights but keeps a GGUF
    # "quantizer" marker, which makes Trainer refuse to train; the weights are not quantized.
    if not all(p.dtype == torch.float32 for p in model.parameters()):
        raise RuntimeError("expected float32 weights after GGUF dequantisation")
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tok.padding_side = "left"
    peft_cfg = None
    if params_mode == "lora":
        peft_cfg = PeftLoraConfig(
            r=RANK,
            lora_alpha=ALPHA,
            lora_dropout=0.0,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
            task_type="CAUSAL_LM",
        )
    ds = Dataset.from_dict({"prompt": texts, "answer": answers})
    step_times: list[float] = []
    rollout_times: list[float] = []
    gen_times: list[float] = []
    lengths: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            step_times.append(time.perf_counter() - self.t0)

    with tempfile.TemporaryDirectory() as out:
        args = TrlGRPOConfig(
            output_dir=out,
            per_device_train_batch_size=NUM_PROMPTS * GROUP,
            gradient_accumulation_steps=1,
            num_generations=GROUP,
            max_completion_length=NEW_TOKENS,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            learning_rate=LR,
            weight_decay=0.0,
            beta=0.0,
            epsilon=0.2,
            loss_type="dapo",
            scale_rewards="group",
            num_iterations=1,
            max_steps=STEPS,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            bf16=False,
            shuffle_dataset=False,
            seed=0,
            # TRL defaults to activation checkpointing; ours keeps activations (it recomputes only
            # the chunked lm_head), so compare without it.
            gradient_checkpointing=False,
        )
        trainer = TrlGRPOTrainer(
            model=model,
            reward_funcs=reward_fn,
            args=args,
            train_dataset=ds,
            processing_class=tok,
            peft_config=peft_cfg,
            callbacks=[StepTimer()],
        )
        trained = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        orig_gs = trainer._generate_and_score_completions
        orig_gen = trainer._generate

        def timed_gs(*a, **k):
            t0 = time.perf_counter()
            out_ = orig_gs(*a, **k)
            rollout_times.append(time.perf_counter() - t0)
            lengths.append(float(out_["completion_mask"].sum(1).float().mean()))
            return out_

        def timed_gen(*a, **k):
            t0 = time.perf_counter()
            out_ = orig_gen(*a, **k)
            gen_times.append(time.perf_counter() - t0)
            return out_

        trainer._generate_and_score_completions = timed_gs
        trainer._generate = timed_gen
        trainer.train()
    if not (len(step_times) == len(rollout_times) == STEPS):
        raise RuntimeError(
            f"TRL timing hooks saw {len(step_times)} steps / {len(rollout_times)} rollouts, "
            f"expected {STEPS} each: the trainer internals changed"
        )
    steps = step_times[1:]
    rolls = rollout_times[1:]
    return {
        "first_step_s": step_times[0],
        "step_s": statistics.median(steps),
        "rollout_s": statistics.median(rolls),
        "generate_s": statistics.median(gen_times[1:]),
        "update_s": statistics.median(s - r for s, r in zip(steps, rolls, strict=True)),
        "completion_len": statistics.median(lengths[1:]),
        "trained_numbers": int(trained),
        "torch_threads": torch.get_num_threads(),
        "peak_rss_mb": peak_rss_mb(),
    }


SIDES = {"ours": bench_ours, "trl": bench_trl}
PARAMS = ("lora", "full")
RESULT_TAG = "GRPO_BENCH_RESULT "


def _pin() -> None:
    """One core for this process and the threads it starts, both sides. XLA's CPU matmuls
    (YNNPACK) ignore --xla_cpu_multi_thread_eigen / intra_op_parallelism_threads and use every
    core they see (measured: 2 cores of CPU time per second of wall with those flags): until this
    benchmark pinned the process, ours ran its matmuls on 2 cores against TRL's 1, and the
    grpo_step.json files before 2026-12-03 19:40 UTC overstate our speedup."""
    if THREADS == 1:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    import torch

    torch.set_num_threads(THREADS)


def run_side(side: str, params_mode: str) -> None:
    """The child process: one side's measurement, printed as one tagged JSON line."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _pin()
    from essa_jax.models import load_tokenizer

    texts, answers = _prompts(load_tokenizer("smollm2-135m-instruct"))
    res = SIDES[side](texts, answers, params_mode)
    print(RESULT_TAG + json.dumps(res), flush=True)


def measure(side: str, params_mode: str) -> dict[str, Any]:
    """One side in its own process (its peak memory its own), stderr passed through."""
    cmd = [sys.executable, "-m", "benchmarks.grpo", "--child", side, "--params", params_mode]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    sys.stdout.write(proc.stdout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_TAG)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{side} / {params_mode} failed (exit {proc.returncode})")
    return json.loads(lines[-1][len(RESULT_TAG) :])


def compare(params_mode: str, ours: dict, trl: dict, config, gflops: float, gbps: float) -> dict:
    """The named numbers of one params mode: each side's, the speedups, and the bound."""
    full = params_mode == "full"
    bound = compute_bound(config, ours["prompt_len"], NEW_TOKENS, gflops, full=full)
    opt = optimizer_bound(ours["trained_numbers"], gbps)
    update_bound = bound["update_bound_s"] + (opt["optimizer_bound_s"] if full else 0.0)
    res = {
        **{f"ours_{k}": v for k, v in ours.items()},
        **{f"trl_{k}": v for k, v in trl.items()},
        "speedup_step": trl["step_s"] / ours["step_s"],
        "speedup_rollout": trl["rollout_s"] / ours["rollout_s"],
        "speedup_update": trl["update_s"] / ours["update_s"],
        **bound,
        **opt,
        # The update's bound: its matmuls, plus (full) AdamW's memory traffic over 134.5M weights
        # (the LoRA factors' ~0.6M are left out).
        "update_total_bound_s": update_bound,
        # Fraction of the bound each side's phases reach, and the largest step speedup over TRL
        # that any implementation could show here: TRL's step over the bound's.
        "ours_rollout_of_bound": bound["rollout_bound_s"] / ours["generate_s"],
        "ours_update_of_bound": update_bound / ours["update_s"],
        "trl_rollout_of_bound": bound["rollout_bound_s"] / trl["generate_s"],
        "trl_update_of_bound": update_bound / trl["update_s"],
        "max_speedup_step": trl["step_s"] / (bound["rollout_bound_s"] + update_bound),
    }
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", choices=(*PARAMS, "both"), default="both")
    parser.add_argument(
        "--out",
        default=None,
        help="write the JSON here (a path without .json) instead of "
        "experiments/results/grpo_step.json (a smoke run never writes over the recorded result)",
    )
    parser.add_argument("--child", choices=tuple(SIDES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_side(args.child, args.params)
        return
    _pin()
    from benchmarks.model import matmul_gflops
    from essa_jax.models.loading import peek_model_config

    config = peek_model_config("smollm2-135m-instruct")  # the GGUF header, no weights
    gflops, gbps = matmul_gflops(2048), copy_gbps()
    modes = PARAMS if args.params == "both" else (args.params,)
    res: dict[str, Any] = {
        "settings": {
            "model": "SmolLM2-135M-Instruct (GGUF Q4_1 dequantised to f32)",
            "prompts": NUM_PROMPTS,
            "group_size": GROUP,
            "max_new_tokens": NEW_TOKENS,
            "params": list(modes),
            "lora_rank": RANK,
            "lora_alpha": ALPHA,
            "lora_targets": list(TARGETS),
            "loss": "grpo clip 0.2/0.2, token_mean (trl loss_type='dapo'), beta=0",
            "optimizer": f"AdamW lr {LR}, one update per step, float32 masters and moments",
            "timed_steps": STEPS - 1,
            "threads_per_side": THREADS,
            "process_per_side": True,
        },
        "copy_gbps": gbps,
    }
    for mode in modes:
        ours, trl = measure("ours", mode), measure("trl", mode)
        numbers = compare(mode, ours, trl, config, gflops, gbps)
        # LoRA's keys unprefixed (as before 2026-12-06), full-parameter's prefixed "full_".
        res.update({(k if mode == "lora" else f"full_{k}"): v for k, v in numbers.items()})
        rows = [
            {
                "impl": name,
                "step_s": numbers[f"{name}_step_s"],
                "rollout_s": numbers[f"{name}_rollout_s"],
                "generate_s": numbers[f"{name}_generate_s"],
                "update_s": numbers[f"{name}_update_s"],
                "first_step_s": numbers[f"{name}_first_step_s"],
                "completion_len": numbers[f"{name}_completion_len"],
                "trained": numbers[f"{name}_trained_numbers"],
                "peak_rss_mb": numbers[f"{name}_peak_rss_mb"],
            }
            for name in ("ours", "trl")
        ]
        what = f"LoRA r{RANK}" if mode == "lora" else "full-parameter"
        print_table(rows, f"GRPO step, SmolLM2-135M, {what}, {NUM_PROMPTS}x{GROUP} rollouts")
        print(f"speedup (trl / ours): step {numbers['speedup_step']:.2f}x")
        print(
            f"bound at {gflops:.0f} GFLOP/s (f32 matmul) and {gbps:.1f} GB/s (copy), {THREADS} "
            f"core(s): rollout {numbers['rollout_bound_s']:.2f} s, update "
            f"{numbers['update_total_bound_s']:.2f} s; ours reaches "
            f"{numbers['ours_rollout_of_bound']:.0%} / {numbers['ours_update_of_bound']:.0%} of "
            f"it, TRL {numbers['trl_rollout_of_bound']:.0%} / "
            f"{numbers['trl_update_of_bound']:.0%}; no implementation can beat TRL's step by "
            f"more than {numbers['max_speedup_step']:.2f}x here"
        )
    write_results("grpo_step", res, out=args.out)


if __name__ == "__main__":
    main()
