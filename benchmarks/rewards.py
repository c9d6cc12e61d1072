"""Host-side cost of tasks, rewards and metrics (they run between device steps every iteration).

Numbers: completions scored per second by the arithmetic reward (first number, exact path), by the
math reward on numeric boxed answers (fast path) and on symbolic LaTeX answers (math-verify path),
the overhead of the failure/timeout guard, pass@k over a large eval, problem generation and local
JSONL loading. Run: `.venv/bin/python -m benchmarks.rewards`.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from benchmarks.common import peak_rss_mb, print_table, write_results


def _rate(fn, items: int, repeats: int = 3) -> dict[str, float]:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return {
        "seconds": best,
        "items": items,
        "per_second": items / best,
        "us_per_item": 1e6 * best / items,
    }


def main() -> None:
    from essa_jax.data import generate_task, load_examples
    from essa_jax.evaluation import mean_pass_at_k
    from essa_jax.rewards import arith_reward, guard_reward, math_reward

    train, _ = generate_task("add_2d", num_train=8000, num_eval=0, seed=0)
    answers = [e["answer"] for e in train]
    prefill = [
        (a if i % 3 else str(int(a) + 1)) + ("<|im_end|>" if i % 2 else "\nThe next one is 12 + 3")
        for i, a in enumerate(answers)
    ]
    boxed = [f"Adding the tens and ones gives $\\boxed{{{a}}}$." for a in answers[:4000]]
    symbolic_pairs = [
        (r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{1}{\sqrt{2}}"),
        (r"\boxed{x^2+2x+1}", "(x+1)^2"),
        (r"\boxed{(1,2)}", "(1, 2)"),
        (r"\boxed{2\pi}", r"\pi+\pi"),
    ] * 25
    sym_comps = [c for c, _ in symbolic_pairs]
    sym_refs = [r for _, r in symbolic_pairs]
    prompts8k = [""] * len(prefill)
    guarded = guard_reward(arith_reward)

    rows = []
    results: dict[str, dict[str, float]] = {}

    def add(name, fn, items, repeats=3):
        r = _rate(fn, items, repeats)
        results[name] = r
        rows.append(
            {
                "case": name,
                "items": items,
                "per_second": r["per_second"],
                "us_per_item": r["us_per_item"],
            }
        )

    math_reward([""], [sym_comps[0]], answer=[sym_refs[0]])  # import sympy / math-verify once
    add(
        "arith_reward (first number)",
        lambda: arith_reward(prompts8k, prefill, answer=answers),
        len(prefill),
    )
    add("arith_reward guarded", lambda: guarded(prompts8k, prefill, answer=answers), len(prefill))
    add(
        "math_reward numeric boxed",
        lambda: math_reward([""] * 4000, boxed, answer=answers[:4000]),
        4000,
    )
    add(
        "math_reward symbolic (math-verify)",
        lambda: math_reward([""] * len(sym_comps), sym_comps, answer=sym_refs),
        len(sym_comps),
        1,
    )
    counts = [i % 257 for i in range(1000)]
    add(
        "pass@k, 1000 problems, n=256, k=1..256",
        lambda: [mean_pass_at_k(counts, 256, k) for k in (1, 2, 4, 8, 16, 32, 64, 128, 256)],
        1000 * 9,
    )
    add(
        "generate add_2d (8000 problems)",
        lambda: generate_task("add_2d", num_train=8000, num_eval=0, seed=1),
        8000,
    )
    add(
        "generate word_problems (5000 problems)",
        lambda: generate_task("word_problems", num_train=5000, num_eval=0, seed=1),
        5000,
    )

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gsm8k_like.jsonl"
        path.write_text(
            "".join(
                json.dumps({"question": e["question"], "answer": f"work\n#### {e['answer']}"})
                + "\n"
                for e in train
            )
        )
        add(
            "load_examples jsonl (8000 rows, cold cache)",
            lambda: load_examples(path, cache_dir=str(Path(tmp) / f"c{time.perf_counter_ns()}")),
            8000,
            1,
        )

    print_table(rows, "tasks, rewards and metrics (host side)")
    write_results("rewards", {"results": results, "peak_rss_mb": peak_rss_mb()})


if __name__ == "__main__":
    main()
