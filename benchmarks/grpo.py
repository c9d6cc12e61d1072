"""One GRPO step (rollout + update) on SmolLM2-135M-Instruct with LoRA: essa_jax vs TRL.

Same run, same settings on both sides: 4 prompts x group 4 = 16 rollouts, 16 new tokens, T = 1.0,
LoRA rank 8 / alpha 16 on q, k, v, o, token-mean ("dapo") aggregation, clip 0.2, beta = 0 (no
reference model), one AdamW update (lr 1e-6) per step on all 16 rollouts, float32, the same
chat-templated prompts and the same host reward function.

Timing:
  * ours: wall time of `GRPOTrainer.step` (compiled; the first, compiling step is reported
    separately as ours_first_step_s). rollout = generation + decode + reward (+ scoring), update =
    the jitted optax step(s), both from the step's own metrics.
  * TRL (PyTorch CPU, GRPOTrainer): step = a TrainerCallback's on_step_begin -> on_step_end
    (covers `training_step` and the optimizer step); rollout = time inside
    `_generate_and_score_completions` (generation, reward, advantages; wrapped on the instance);
    update = step - rollout; generate = time inside `_generate` alone. The first step (warm-up)
    is dropped; medians of the rest.
"""

from __future__ import annotations

import os
import re
import statistics
import tempfile
import time

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


def compute_bound(config, prompt_len: int, new_tokens: int, gflops: float) -> dict[str, float]:
    """The step's matmul FLOPs and the seconds they take at `gflops` (dense f32 matmul rate
    measured in this run, on the cores the sides run on): a lower bound on either side's step.

    Rollout: the prompt pass over all rows x prompt_len slots (lm_head on the last position only)
    and new_tokens - 1 decode steps over all rows (every row decodes until the last finishes).
    Update (no remat): forward + the backward's input gradients, 2 x 2 x layer weights per token
    (the LoRA factors' own products are ~1% and left out), and the lm_head on the completion only,
    run three times (forward, the chunk's recomputation, its backward).
    Attention's products are ~2% at these lengths and left out, so the bound is a lower one.
    """
    c = config
    dq, dkv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    d, inter = c.hidden_size, c.intermediate_size
    layer = c.num_layers * (d * (dq + 2 * dkv) + dq * d + 3 * d * inter)
    head = c.hidden_size * c.vocab_size
    rows = NUM_PROMPTS * GROUP
    rollout = 2 * rows * (prompt_len * layer + head) + 2 * rows * (new_tokens - 1) * (layer + head)
    update = 2 * 2 * rows * (prompt_len + new_tokens) * layer + 3 * 2 * rows * new_tokens * head
    return {
        "matmul_gflops": gflops,
        "rollout_gflop": rollout / 1e9,
        "update_gflop": update / 1e9,
        "rollout_bound_s": rollout / 1e9 / gflops,
        "update_bound_s": update / 1e9 / gflops,
    }


def bench_ours(texts: list[str], answers: list[str]) -> dict[str, float]:
    import jax

    from essa_jax.lora import LoraConfig, init_lora, lora_policy
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
    lora = init_lora(jax.random.key(0), config, LoraConfig(rank=RANK, alpha=ALPHA, targets=TARGETS))
    trainable, frozen, to_lora = lora_policy(lora)
    trainer = GRPOTrainer(
        config,
        cfg,
        to_lora=to_lora,
        reward_fn=reward_fn,
        decode=lambda t: tok.decode(t, skip_special_tokens=True),
    )
    state = trainer.init(trainable, jax.random.key(0))
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
        "ours_first_step_s": steps[0]["wall_s"],
        "ours_step_s": med("wall_s"),
        "ours_rollout_s": statistics.median(
            s["rollout_s"] + s["reward_s"] + s["score_s"] for s in rest
        ),
        "ours_generate_s": med("rollout_s"),
        "ours_update_s": med("update_s"),
        "ours_completion_len": med("completion_len_mean"),
        "ours_reward_mean": float(np.mean([s["reward_mean"] for s in steps])),
        "prompt_len": int(prompt_tokens.shape[1]),
        "_config": config,
    }


def bench_trl(texts: list[str], answers: list[str]) -> dict[str, float]:
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
        "trl_first_step_s": step_times[0],
        "trl_step_s": statistics.median(steps),
        "trl_rollout_s": statistics.median(rolls),
        "trl_generate_s": statistics.median(gen_times[1:]),
        "trl_update_s": statistics.median(s - r for s, r in zip(steps, rolls, strict=True)),
        "trl_completion_len": statistics.median(lengths[1:]),
        "torch_threads": torch.get_num_threads(),
    }


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if THREADS == 1:
        # One core for the whole process, both sides. XLA's CPU matmuls (YNNPACK) ignore
        # --xla_cpu_multi_thread_eigen / intra_op_parallelism_threads and use every core they see
        # (measured: 2 cores of CPU time per second of wall with those flags): until this
        # benchmark pinned the process, ours ran its matmuls on 2 cores against TRL's 1, and the
        # grpo_step.json files before 2026-12-03 19:40 UTC overstate our speedup.
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    import torch

    torch.set_num_threads(THREADS)
    from essa_jax.models import load_tokenizer

    texts, answers = _prompts(load_tokenizer("smollm2-135m-instruct"))
    from benchmarks.model import matmul_gflops

    ours = bench_ours(texts, answers)
    config = ours.pop("_config")
    print("ours:", ours, flush=True)
    trl = bench_trl(texts, answers)
    bound = compute_bound(config, ours["prompt_len"], NEW_TOKENS, matmul_gflops(2048))
    res = {
        "settings": {
            "model": "SmolLM2-135M-Instruct (GGUF Q4_1 dequantised to f32)",
            "prompts": NUM_PROMPTS,
            "group_size": GROUP,
            "max_new_tokens": NEW_TOKENS,
            "lora_rank": RANK,
            "lora_alpha": ALPHA,
            "lora_targets": list(TARGETS),
            "loss": "grpo clip 0.2/0.2, token_mean (trl loss_type='dapo'), beta=0",
            "optimizer": f"AdamW lr {LR}, one update per step",
            "timed_steps": STEPS - 1,
            "threads_per_side": THREADS,
        },
        **ours,
        **trl,
        "speedup_step": trl["trl_step_s"] / ours["ours_step_s"],
        "speedup_rollout": trl["trl_rollout_s"] / ours["ours_rollout_s"],
        "speedup_update": trl["trl_update_s"] / ours["ours_update_s"],
        **bound,
        # Fraction of the matmul rate each side's phases reach, and the largest step speedup over
        # TRL that any implementation could show here: TRL's step over the bound's.
        "ours_rollout_of_bound": bound["rollout_bound_s"] / ours["ours_generate_s"],
        "ours_update_of_bound": bound["update_bound_s"] / ours["ours_update_s"],
        "trl_rollout_of_bound": bound["rollout_bound_s"] / trl["trl_generate_s"],
        "trl_update_of_bound": bound["update_bound_s"] / trl["trl_update_s"],
        "max_speedup_step": trl["trl_step_s"]
        / (bound["rollout_bound_s"] + bound["update_bound_s"]),
        "peak_rss_mb": peak_rss_mb(),
    }
    rows = [
        {
            "impl": name,
            "step_s": res[f"{name}_step_s"],
            "rollout_s": res[f"{name}_rollout_s"],
            "generate_s": res[f"{name}_generate_s"],
            "update_s": res[f"{name}_update_s"],
            "first_step_s": res[f"{name}_first_step_s"],
            "completion_len": res[f"{name}_completion_len"],
        }
        for name in ("ours", "trl")
    ]
    print_table(rows, f"GRPO step, SmolLM2-135M, LoRA r{RANK}, {NUM_PROMPTS}x{GROUP} rollouts")
    print(f"speedup (trl / ours): step {res['speedup_step']:.2f}x")
    print(
        f"compute bound at {bound['matmul_gflops']:.0f} GFLOP/s (f32 matmul, {THREADS} core(s)): "
        f"rollout "
        f"{bound['rollout_bound_s']:.2f} s, update {bound['update_bound_s']:.2f} s; ours reaches "
        f"{res['ours_rollout_of_bound']:.0%} / {res['ours_update_of_bound']:.0%} of it, TRL "
        f"{res['trl_rollout_of_bound']:.0%} / {res['trl_update_of_bound']:.0%}; no implementation "
        f"can beat TRL's step by more than {res['max_speedup_step']:.2f}x here"
    )
    write_results("grpo_step", res)


if __name__ == "__main__":
    main()
