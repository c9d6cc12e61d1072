"""Benchmark section `model`: SmolLM2-135M (float32) prefill and decode throughput, ours vs HF.

Ours: `generate_jit` (KV cache, while_loop decode) on left-padded 32-token prompts. Prefill time is
a jitted prompt pass that fills the cache and returns the last logits; decode time is
generate(N new tokens) - generate(1 new token), i.e. the N - 1 cached decode steps. Compile time is
reported separately (first call minus steady state). HF: transformers `generate` (torch CPU, same
thread count, greedy, min_new_tokens = max_new_tokens so lengths match), timed the same way: decode
= generate(N) - generate(1); its prefill is one forward with use_cache=True and logits_to_keep=1
(what its generate runs). MFU = model FLOPs/s of our prefill / measured f32 matmul
FLOP/s, the best of measurements taken at the start and before every batch (each is in the JSON).
Environment knobs: BENCH_MODEL_BATCHES (e.g. "1,16"), BENCH_MODEL_NEW_TOKENS.
"""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import machine_info, peak_rss_mb, print_table, time_fn, write_results
from essa_jax.models import (
    ModelConfig,
    generate_jit,
    hidden_states,
    init_cache,
    lm_head,
    load_pretrained,
    smollm2_gguf_path,
)

PROMPT_LEN = 32


def matmul_gflops(n: int = 4096) -> float:
    """Measured float32 matmul throughput (GFLOP/s) of this backend on an n x n x n product."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    f = jax.jit(lambda a, b: a @ b)
    t = time_fn(lambda: f(a, b), repeats=3)
    return 2 * n**3 / t["min_s"] / 1e9


def prefill_flops(c: ModelConfig, batch: int, length: int) -> float:
    """Useful FLOPs of a prompt pass: 2 * weights * tokens + causal attention + last-token head."""
    dq, dkv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    per_token = (
        2
        * c.num_layers
        * (
            c.hidden_size * (dq + 2 * dkv)
            + dq * c.hidden_size
            + 3 * c.hidden_size * c.intermediate_size
        )
    )
    # QK^T and PV, each 2 * T^2 / 2 * dq per layer (causal half).
    attention = 2 * 2 * c.num_layers * batch * dq * length * length / 2
    head = 2 * c.hidden_size * c.vocab_size * batch
    return per_token * batch * length + attention + head


def prefill_mfu(c: ModelConfig, batch: int, prefill_s: float, gflops: float) -> float:
    """Model FLOP utilisation of a prompt pass that took `prefill_s` against `gflops` GFLOP/s."""
    return prefill_flops(c, batch, PROMPT_LEN) / prefill_s / (gflops * 1e9)


def bench_ours(config, params, tokens, mask, new_tokens):
    B, T = tokens.shape

    @jax.jit
    def prefill(params, tokens, mask):
        cache = init_cache(config, B, T + new_tokens, params["embed"].dtype)
        h, cache = hidden_states(params, config, tokens, attention_mask=mask, cache=cache)
        return lm_head(params, config, h[:, -1]), cache

    def gen(n):
        return lambda: generate_jit(
            params,
            config,
            tokens,
            mask,
            jax.random.key(0),
            max_new_tokens=n,
            greedy=True,
            eos_token_ids=(),
        )

    t_pre = time_fn(lambda: prefill(params, tokens, mask), repeats=3)
    t_one = time_fn(gen(1), repeats=2)
    t_all = time_fn(gen(new_tokens), repeats=2)
    decode_s = max(t_all["min_s"] - t_one["min_s"], 1e-9)
    return {
        "prefill_s": t_pre["min_s"],
        "prefill_tok_s": B * T / t_pre["min_s"],
        "decode_tok_s": B * (new_tokens - 1) / decode_s,
        "total_tok_s": B * new_tokens / t_all["min_s"],
        "compile_s": t_all["first_s"] - t_all["min_s"],
    }


def bench_hf(model, tokens, mask, new_tokens, repeats=2, warmup=True):
    """transformers, measured like `bench_ours`: decode = generate(N) - generate(1), min of repeats.

    Prefill is one forward with `logits_to_keep=1`, as transformers' `generate` runs it (last-token
    logits only; the full [B, T, V] head would add about a quarter to the prompt pass, and
    subtracting that from generate(N) overstated HF decode throughput, impossibly at batch 256).
    """
    import torch

    t = torch.as_tensor(np.asarray(tokens), dtype=torch.long)
    m = torch.as_tensor(np.asarray(mask), dtype=torch.long)
    B, T = t.shape

    def best_of(fn):
        if warmup:
            fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    def gen(n):
        return lambda: model.generate(
            input_ids=t,
            attention_mask=m,
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=2,
        )

    with torch.no_grad():
        pre = best_of(
            lambda: model(input_ids=t, attention_mask=m, use_cache=True, logits_to_keep=1)
        )
        one = best_of(gen(1))
        total = best_of(gen(new_tokens))
    return {
        "prefill_s": pre,
        "prefill_tok_s": B * T / pre,
        "decode_tok_s": B * (new_tokens - 1) / max(total - one, 1e-9),
        "total_tok_s": B * new_tokens / total,
    }


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(os.cpu_count())
    batches = [int(b) for b in os.environ.get("BENCH_MODEL_BATCHES", "1,16,64,256").split(",")]
    new_tokens = int(os.environ.get("BENCH_MODEL_NEW_TOKENS", "32"))
    # transformers at batch 256 takes minutes per call on a small CPU: fewer new tokens there.
    hf_new_tokens = {b: (8 if b >= 256 else new_tokens) for b in batches}

    gguf = smollm2_gguf_path()
    t0 = time.perf_counter()
    config, params = load_pretrained(gguf)
    load_s = time.perf_counter() - t0
    hf = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    ).eval()
    gflops = matmul_gflops()

    rng = np.random.default_rng(0)
    rows, results = (
        [],
        {
            "load_s": load_s,
            "matmul_gflops": gflops,
            "prompt_len": PROMPT_LEN,
            "new_tokens": new_tokens,
        },
    )
    for B in batches:
        # Random ordinary tokens (ids >= 100 avoid special tokens), a few rows left-padded.
        tokens = rng.integers(100, config.vocab_size, (B, PROMPT_LEN)).astype(np.int32)
        mask = np.ones((B, PROMPT_LEN), np.int32)
        mask[::4, : PROMPT_LEN // 4] = 0
        tokens[mask == 0] = config.effective_pad_id
        # The matmul reference is re-measured next to every batch and the best one kept: one
        # measurement taken while a neighbour (or torch's spinning threads) holds a core reads low
        # and would inflate every MFU of the run.
        gflops_here = matmul_gflops()
        gflops = max(gflops, gflops_here)
        results[f"matmul_gflops_at_b{B}"] = gflops_here
        ours = bench_ours(config, params, jnp.asarray(tokens), jnp.asarray(mask), new_tokens)
        # transformers at batch 256 takes minutes per call on a small CPU: one timed call each.
        big = B >= 256
        ref = bench_hf(hf, tokens, mask, hf_new_tokens[B], repeats=1 if big else 2, warmup=not big)
        mfu = prefill_mfu(config, B, ours["prefill_s"], gflops)
        results["matmul_gflops"] = gflops
        for k, v in ours.items():
            results[f"ours_{k}_b{B}"] = v
        for k, v in ref.items():
            results[f"hf_{k}_b{B}"] = v
        results[f"hf_new_tokens_b{B}"] = hf_new_tokens[B]
        results[f"prefill_mfu_b{B}"] = mfu
        rows.append(
            {
                "batch": B,
                "ours_prefill_tok_s": ours["prefill_tok_s"],
                "hf_prefill_tok_s": ref["prefill_tok_s"],
                "ours_decode_tok_s": ours["decode_tok_s"],
                "hf_decode_tok_s": ref["decode_tok_s"],
                "decode_speedup": ours["decode_tok_s"] / ref["decode_tok_s"],
                "prefill_mfu": mfu,
                "ours_compile_s": ours["compile_s"],
            }
        )
        print_table(rows[-1:], f"batch {B}")
        # Written after every batch so that a run cut short still leaves its numbers.
        write_results("model_generation", {**results, "peak_rss_mb": peak_rss_mb()})
    # Every MFU against the best matmul throughput of the whole run.
    for row in rows:
        B = row["batch"]
        row["prefill_mfu"] = prefill_mfu(config, B, results[f"ours_prefill_s_b{B}"], gflops)
        results[f"prefill_mfu_b{B}"] = row["prefill_mfu"]
    results["peak_rss_mb"] = peak_rss_mb()
    print_table(
        rows,
        f"model: SmolLM2-135M f32, {PROMPT_LEN}-token prompts, {new_tokens} new "
        f"tokens (HF at batch 256: {hf_new_tokens.get(256, new_tokens)}); "
        f"matmul {gflops:.0f} GFLOP/s; {machine_info()['cores']} cores",
    )
    write_results("model_generation", results)


if __name__ == "__main__":
    main()
