"""Held-out evaluation: greedy accuracy with a 95% Wilson interval, unbiased pass@k, paired tests.

    heldout_accuracy(sample_fn, prompts, fields, reward_fn) -> {acc, correct, n, ci_low, ci_high,
        reward, eval_tokens, solved}
    heldout_pass_at_k(sample_fn, prompts, fields, reward_fn, samples=n, ks=(1, ...)) ->
        {pass_at_<k>, pass_at_<k>_ci, pass_samples, pass_problems, pass_tokens, pass_correct, ...}
    pass_at_k_values(summary) -> {k: pass@k}
    pass_at_k(n, c, k); pass_at_k_per_problem(counts, n, k); mean_pass_at_k(counts, n, k);
    bootstrap_ci(values [..., P]); bootstrap_pass_at_k(counts, n, ks) (intervals over problems);
    wilson_interval(successes, n);
    mcnemar_exact(before, after) (paired 0/1 outcomes, e.g. two `solved` strings)

`sample_fn(num_samples, greedy) -> (completions[problem][sample], generated_tokens)` is the only
link to a model.
"""

from .evaluate import SampleFn, heldout_accuracy, heldout_pass_at_k, pass_at_k_values
from .metrics import (
    Z95,
    bootstrap_ci,
    bootstrap_pass_at_k,
    mcnemar_exact,
    mean_pass_at_k,
    pass_at_k,
    pass_at_k_per_problem,
    wilson_interval,
)

__all__ = [
    "Z95",
    "SampleFn",
    "bootstrap_ci",
    "bootstrap_pass_at_k",
    "heldout_accuracy",
    "heldout_pass_at_k",
    "mcnemar_exact",
    "mean_pass_at_k",
    "pass_at_k",
    "pass_at_k_per_problem",
    "pass_at_k_values",
    "wilson_interval",
]
