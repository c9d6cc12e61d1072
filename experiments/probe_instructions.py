"""Probe: is the base model imperfect on the instruction task, and do its samples disagree?

ES ranks candidates and GRPO normalises within a prompt's group, so both need prompts on which
the model sometimes follows the instructions and sometimes not. This scores the base model of
`experiments/configs/essa_smollm2_instructions.py` (SmolLM2-135M-Instruct, no adapter) on the
first PROBLEMS held-out prompts: one greedy completion and SAMPLES completions at T = 1 each,
scored with the IFEval rewards (lm-eval's checkers). Reported: greedy and sampled prompt- /
instruction-level strict accuracy, per instruction type, the fraction of prompts whose samples
disagree (some follow all instructions, some do not), the mean within-prompt standard deviation of
the instruction-level reward (GRPO's advantage scale), and pass@k.

    PYTHONPATH=. python experiments/probe_instructions.py [--problems 48] [--samples 8]
        -> experiments/results/instructions_probe.json (date, commit, settings, numbers)

Generation goes through `essa_jax.evaluation.lm_eval_model.EssaJaxLM` (our `generate` behind
lm-eval's interface), with the prompts the training run builds (chat format, empty system turn).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from collections import defaultdict

import numpy as np

CONFIG = "experiments/configs/essa_smollm2_instructions.py"
OUT = "experiments/results/instructions_probe.json"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--problems", type=int, default=48)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--output", default=OUT)
    args = p.parse_args()

    from lm_eval.api.instance import Instance

    from essa_jax.config import load_config_file
    from essa_jax.data import build_prompt, load_task
    from essa_jax.evaluation.lm_eval_model import EssaJaxLM
    from essa_jax.evaluation.metrics import mean_pass_at_k
    from essa_jax.rewards import follow_instructions
    from essa_jax.train.pipeline import load_model
    from essa_jax.train.tasks import data_task_config

    # The code that runs: HEAD now, not at the end (commits may land while the probe runs).
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    config = load_config_file(CONFIG)
    task = load_task(data_task_config(config.task, config.seed))
    examples = task.eval[: args.problems]
    model_config, params, tokenizer = load_model(config)
    prompts = [build_prompt(ex, tokenizer, **task.prompt_kwargs()) for ex in examples]
    lm = EssaJaxLM(model_config, params, tokenizer, batch_size=args.batch_size, seed=config.seed)
    max_new = int(config.generation.max_new_tokens)

    def run(gen_kwargs, copies):
        reqs = [
            Instance("generate_until", {}, (pr, gen_kwargs), idx=0)
            for pr in prompts
            for _ in range(copies)
        ]
        return lm.generate_until(reqs)

    t0 = time.time()
    greedy = run({"until": [], "max_gen_toks": max_new, "do_sample": False}, 1)
    t_greedy = time.time() - t0
    sampled = run(
        {"until": [], "max_gen_toks": max_new, "do_sample": True, "temperature": 1.0}, args.samples
    )
    t_sampled = time.time() - t0 - t_greedy

    def verdicts(ex, text):
        return follow_instructions(
            ex["question"], text, ex["instruction_id_list"], ex["kwargs"], loose=False
        )

    per_type = defaultdict(lambda: {"greedy": [], "sampled": []})
    greedy_prompt, greedy_inst, samp_prompt, samp_inst = [], [], [], []
    for i, ex in enumerate(examples):
        v = verdicts(ex, greedy[i])
        greedy_prompt.append(float(all(v)))
        greedy_inst.append(float(np.mean(v)))
        for iid, ok in zip(ex["instruction_id_list"], v, strict=True):
            per_type[iid]["greedy"].append(ok)
        row_p, row_i = [], []
        for s in sampled[i * args.samples : (i + 1) * args.samples]:
            v = verdicts(ex, s)
            row_p.append(float(all(v)))
            row_i.append(float(np.mean(v)))
            for iid, ok in zip(ex["instruction_id_list"], v, strict=True):
                per_type[iid]["sampled"].append(ok)
        samp_prompt.append(row_p)
        samp_inst.append(row_i)
    samp_prompt, samp_inst = np.asarray(samp_prompt), np.asarray(samp_inst)
    correct = samp_prompt.sum(1).astype(int)
    ks = [k for k in (1, 2, 4, 8, 16, 32) if k <= args.samples]
    result = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M+00:00"),
        "commit": commit,
        "machine": f"{os.cpu_count()}-core CPU, float32",
        "config": CONFIG,
        "model": config.model.path + " (base, no adapter)",
        "task": f"{config.task.name} held-out, first {len(examples)} prompts (seed {config.seed})",
        "samples_per_prompt": args.samples,
        "max_new_tokens": max_new,
        "greedy": {
            "prompt_strict": float(np.mean(greedy_prompt)),
            "inst_strict": float(np.mean(greedy_inst)),
        },
        "sampled_T1": {
            "prompt_strict": float(samp_prompt.mean()),
            "inst_strict": float(samp_inst.mean()),
            "pass_at_k": {str(k): float(mean_pass_at_k(correct, args.samples, k)) for k in ks},
            # Prompts whose samples disagree on "all instructions followed": GRPO groups with a
            # non-zero advantage, prompts on which ES candidates can differ.
            "prompts_with_mixed_outcomes": float(np.mean((correct > 0) & (correct < args.samples))),
            "prompts_never_followed": float(np.mean(correct == 0)),
            "prompts_always_followed": float(np.mean(correct == args.samples)),
            "mean_within_prompt_std_inst_reward": float(samp_inst.std(1).mean()),
        },
        "per_instruction_type": {
            iid: {
                "n_greedy": len(d["greedy"]),
                "greedy": float(np.mean(d["greedy"])),
                "sampled": float(np.mean(d["sampled"])),
            }
            for iid, d in sorted(per_type.items())
        },
        "seconds": {"greedy": round(t_greedy, 1), "sampled": round(t_sampled, 1)},
        "examples": [
            {"prompt": ex["question"], "greedy": greedy[i], "greedy_follows": greedy_prompt[i]}
            for i, ex in enumerate(examples[:6])
        ],
    }
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    tmp = args.output + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    os.replace(tmp, args.output)
    print(json.dumps({k: result[k] for k in ("greedy", "sampled_T1", "seconds")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
