"""Held-out evaluation: greedy accuracy with a 95% interval, avg@k, unbiased pass@k.

    evaluate(sample_fn, examples, prompt_token_ids, reward_fn=..., num_samples=n) -> dict
    evaluate_task(sample_fn, task, tokenizer, num_samples=n) -> dict
    pass_at_k(n, c, k); avg_at_k(counts, k); wilson_interval(successes, n);
    mcnemar_exact(before, after) (paired 0/1 outcomes)

`sample_fn(prompt_token_lists, num_samples, greedy) -> list[list[str]]` is the only link to a model.
"""

from .evaluate import SampleFn, evaluate, evaluate_task
from .metrics import (
    Z95,
    avg_at_k,
    ks_up_to,
    mcnemar_exact,
    mean_interval,
    mean_pass_at_k,
    pass_at_k,
    wilson_interval,
)

__all__ = [
    "Z95",
    "SampleFn",
    "avg_at_k",
    "evaluate",
    "evaluate_task",
    "ks_up_to",
    "mcnemar_exact",
    "mean_interval",
    "mean_pass_at_k",
    "pass_at_k",
    "wilson_interval",
]
