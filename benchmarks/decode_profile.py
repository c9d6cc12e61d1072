"""Benchmark section `decode_profile`: where a SmolLM2-135M decode step's time goes (float32, CPU).

One decode step of `generate`'s CPU path (the unrolled layer loop over per-layer weights and a
per-layer KV cache), split into parts, each timed as R steps inside one compiled `fori_loop` (no
per-step dispatch), best of rounds:

  * layers: `hidden_states` of one new token per row against a cache of S slots, for several S;
  * layer matmuls: the same layers' seven projections alone (real weights, same shapes);
  * lm_head: the [B, d] x [d, V] logits; sampling: greedy argmax + the logsumexp of the log-prob;
  * a sampled step's draw (`models.sampling`, one key per row), next to jax.random.categorical's.

layers - layer matmuls is what the rest of a layer costs (attention over the S slots, norms, RoPE,
the cache write); its slope in S is attention's cost per cache slot. The matmul rate of each part
is set against a large square matmul measured in the same run. Environment: BENCH_DECODE_BATCH
(default 64), BENCH_DECODE_SLOTS (default "63,128,256,512"; 63 is the model bench's cache).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import print_table, time_fn, write_results
from benchmarks.model import matmul_gflops
from essa_jax.models import lm_head, load_pretrained, prefill, smollm2_gguf_path
from essa_jax.models.sampling import sample_tokens
from essa_jax.models.transformer import hidden_states, per_layer_cache, per_layer_params

STEPS = 10  # decode steps per timed program
ROUNDS = 3


def _per_step(fn, *args) -> float:
    """Best seconds per step of `fn(*args)` (a program of STEPS steps) over ROUNDS x 3 calls."""
    return min(time_fn(lambda: fn(*args), repeats=3)["min_s"] for _ in range(ROUNDS)) / STEPS


def _steps(body):
    """jit(fori_loop of STEPS x body) over a tuple of loop-carried arguments."""
    return jax.jit(lambda *a: jax.lax.fori_loop(0, STEPS, lambda i, a: body(*a), a))


def main() -> None:
    B = int(os.environ.get("BENCH_DECODE_BATCH", "64"))
    slots = [int(s) for s in os.environ.get("BENCH_DECODE_SLOTS", "63,128,256,512").split(",")]
    config, params = load_pretrained(smollm2_gguf_path())
    c = config
    L, d, V = c.num_layers, c.hidden_size, c.vocab_size
    dq, dkv, inter = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size
    layer_flops = 2 * B * L * (d * (dq + 2 * dkv) + dq * d + 3 * d * inter)
    head_flops = 2 * B * d * V
    gflops = matmul_gflops()
    per_layer = per_layer_params(params)
    prompt_len = 32
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(100, V, (B, prompt_len)), jnp.int32)
    mask = jnp.ones((B, prompt_len), jnp.int32)

    def layers(p, tok, cache):
        h, cache = hidden_states(p, c, tok[:, None], cache=cache)
        # Step the cache back so every timed step attends to the same S slots.
        cache = cache.replace(index=cache.index - 1, next_pos=cache.next_pos - 1)
        return p, tok + (h[:, 0, 0] > 1e9).astype(jnp.int32), cache

    layers_fn = _steps(layers)
    layer_s = {}
    for S in slots:
        fill = jax.jit(lambda p, t, m, S=S: prefill(p, c, t, max_len=S, attention_mask=m)[1])
        cache = per_layer_cache(fill(params, tokens, mask))
        layer_s[S] = _per_step(layers_fn, per_layer, tokens[:, -1], cache)

    names = ("q", "k", "v", "o", "gate", "up", "down")
    kernels = tuple({n: lay[n]["kernel"] for n in names} for lay in per_layer["layers"])

    def matmuls(ks, x):
        for k in ks:
            q, kk, v = x @ k["q"], x @ k["k"], x @ k["v"]
            o = q @ k["o"]
            gated = jax.nn.silu(o @ k["gate"]) * (o @ k["up"])
            x = jnp.tanh(x + gated @ k["down"] + 1e-6 * (kk.sum() + v.sum()))
        return ks, x

    x0 = jax.random.normal(jax.random.key(0), (B, d))
    matmul_s = _per_step(_steps(matmuls), kernels, x0)

    def head(p, h):
        return p, jnp.tanh(h + lm_head(p, c, h)[:, :d])

    head_s = _per_step(_steps(head), params, x0)
    logits = jax.random.normal(jax.random.key(1), (B, V))

    def sample(lg, tok):
        tok, lp = sample_tokens(None, lg, temperature=1.0, top_k=0, top_p=1.0, greedy=True)
        return lg + 1e-9 * lp[:, None], tok

    sample_s = _per_step(_steps(sample), logits, tokens[:, -1])

    # A sampled step's draw at T = 1 (one key per row, as GRPO rollouts), against the Gumbel-max
    # draw of jax.random.categorical that `models.sampling.draw_tokens` replaced.
    row_keys = jax.random.split(jax.random.key(2), B)

    def draw(lg, keys):
        tok, lp = sample_tokens(
            keys, lg, temperature=1.0, top_k=0, top_p=1.0, greedy=False, per_row=True
        )
        return lg + 1e-9 * lp[:, None], jax.vmap(lambda k: jax.random.fold_in(k, 1))(keys)

    def gumbel(lg, keys):
        tok = jax.vmap(jax.random.categorical)(keys, lg)
        lp = jnp.take_along_axis(lg, tok[:, None], -1)[:, 0] - jax.nn.logsumexp(lg, -1)
        return lg + 1e-9 * lp[:, None], jax.vmap(lambda k: jax.random.fold_in(k, 1))(keys)

    draw_s = _per_step(_steps(draw), logits, row_keys)
    gumbel_s = _per_step(_steps(gumbel), logits, row_keys)

    slope = float(np.polyfit(slots, [layer_s[S] for S in slots], 1)[0]) if len(slots) > 1 else 0.0
    rows = []
    for S in slots:
        step = layer_s[S] + head_s + sample_s
        rows.append(
            {
                "slots": S,
                "step_ms": 1e3 * step,
                "layer_matmuls_ms": 1e3 * matmul_s,
                "rest_of_layers_ms": 1e3 * (layer_s[S] - matmul_s),
                "lm_head_ms": 1e3 * head_s,
                "sampling_ms": 1e3 * sample_s,
                "matmul_share": (matmul_s + head_s) / step,
                "tok_s": B / step,
            }
        )
    results = {
        "batch": B,
        "steps_per_program": STEPS,
        "matmul_gflops": gflops,
        "layer_matmuls_s": matmul_s,
        "layer_matmuls_gflops": layer_flops / matmul_s / 1e9,
        "lm_head_s": head_s,
        "lm_head_gflops": head_flops / head_s / 1e9,
        "sampling_s": sample_s,
        "sampled_draw_s": draw_s,
        "categorical_draw_s": gumbel_s,
        "layers_s": {str(S): t for S, t in layer_s.items()},
        "attention_s_per_slot": slope,
        "rows": rows,
    }
    print_table(
        rows,
        f"decode step, SmolLM2-135M f32, batch {B}: layer matmuls at "
        f"{results['layer_matmuls_gflops']:.0f}, lm_head at {results['lm_head_gflops']:.0f} of "
        f"{gflops:.0f} GFLOP/s (square matmul); attention {1e3 * slope:.2f} ms per cache slot; "
        f"a sampled draw {1e3 * draw_s:.1f} ms (jax.random.categorical: {1e3 * gumbel_s:.1f} ms)",
    )
    write_results("decode_profile", results)


if __name__ == "__main__":
    main()
