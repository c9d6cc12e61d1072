"""Held-out evaluation of a model behind a sampling callable (no model internals here).

The model side is a `sample_fn(num_samples, greedy) -> (completions, num_tokens)`: for every
problem of the evaluated set, in order, `num_samples` completion strings, and the number of tokens
generated for them (the evaluation's cost). The caller binds the model, the prompts and the
sampling key; a plain model, an adapter, or one member of an ESSA population all fit behind it.
`essa_jax.train.rollouts.policy_sample_fn` is the one the pipeline uses (batched `generate_jit`,
fixed padded shapes, so it compiles once).

A completion is correct when its reward is >= `success_threshold` (1.0: the verifiable rewards
are 1.0 / 0.0). Rewards are compared and averaged in float32, as the training loops see them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from essa_jax.rewards import guard_reward

from .metrics import bootstrap_pass_at_k, mean_pass_at_k, wilson_interval

SampleFn = Callable[[int, bool], tuple[list[list[str]], int]]

# Keys of `heldout_pass_at_k`'s result: "pass_at_<k>" the estimate, "pass_at_<k>_ci" its interval.
_PASS_KEY = re.compile(r"^pass_at_(\d+)$")


def pass_at_k_values(result: Mapping[str, Any]) -> dict[int, float]:
    """{k: pass@k} of the "pass_at_<k>" entries of a result or summary dict, k ascending (the
    "pass_at_<k>_ci" intervals and other keys are skipped)."""
    found = {int(m.group(1)): float(v) for key, v in result.items() if (m := _PASS_KEY.match(key))}
    return dict(sorted(found.items()))


def _sample(
    sample_fn: SampleFn, num_problems: int, num_samples: int, greedy: bool
) -> tuple[list[list[str]], int]:
    completions, num_tokens = sample_fn(num_samples, greedy)
    if len(completions) != num_problems or any(len(c) != num_samples for c in completions):
        shape = [len(c) for c in completions][:5]
        raise ValueError(
            f"sample_fn returned {len(completions)} problems with {shape}... completions; "
            f"expected {num_problems} problems of {num_samples} completions each (greedy={greedy})"
        )
    return [[str(s) for s in c] for c in completions], int(num_tokens)


def _rewards(
    reward_fn: Callable[..., Sequence[float]],
    prompts: Sequence[Any],
    fields: Mapping[str, Sequence[Any]],
    completions: list[list[str]],
) -> np.ndarray:
    """Rewards `[problems, samples]` float32: one (guarded) reward call on all completions."""
    num_samples = len(completions[0])
    rep = lambda xs: [x for x in xs for _ in range(num_samples)]  # noqa: E731
    flat = [s for c in completions for s in c]
    rewards = guard_reward(reward_fn)(rep(prompts), flat, **{k: rep(v) for k, v in fields.items()})
    return np.asarray(rewards, np.float32).reshape(len(completions), num_samples)


def _check(prompts: Sequence[Any], fields: Mapping[str, Sequence[Any]]) -> int:
    if not prompts:
        raise ValueError("held-out evaluation needs at least one problem")
    for name, values in fields.items():
        if len(values) != len(prompts):
            raise ValueError(f"field {name!r} has {len(values)} values for {len(prompts)} prompts")
    return len(prompts)


def heldout_accuracy(
    sample_fn: SampleFn,
    prompts: Sequence[Any],
    fields: Mapping[str, Sequence[Any]],
    reward_fn: Callable[..., Sequence[float]],
    *,
    success_threshold: float = 1.0,
    keep_samples: int = 0,
) -> dict[str, Any]:
    """Greedy accuracy on the problems `prompts` (one greedy completion each).

    Args:
      sample_fn: the model side (module docstring), bound to these problems.
      prompts: prompt texts, given to the reward; fields: task columns aligned with them (e.g.
        `answer`), passed to `reward_fn(prompts, completions, **fields) -> list[float]`.

    Returns {acc, correct, n, ci_low, ci_high, reward, eval_tokens, solved}: the fraction and count
    of correct problems, its 95% Wilson interval, the mean reward, the generated tokens, and
    `solved`, a string of n "0"/"1" in problem order, so that two policies evaluated on the same
    set compare paired (`mcnemar_exact`). With `keep_samples` > 0 also `samples`: the first
    `keep_samples` problems as {prompt, completion, answer, reward} (answer: the task's `answer`
    field, None without one), what a zero score is diagnosed from.
    """
    n = _check(prompts, fields)
    completions, num_tokens = _sample(sample_fn, n, 1, True)
    rewards = _rewards(reward_fn, prompts, fields, completions).reshape(n)
    solved = rewards >= success_threshold
    correct = int(np.sum(solved))
    lo, hi = wilson_interval(correct, n)
    answers = fields.get("answer", [None] * n)
    samples = [
        {"prompt": prompts[i], "completion": completions[i][0], "answer": answers[i],
         "reward": float(rewards[i])}
        for i in range(min(keep_samples, n))
    ]  # fmt: skip
    return {
        "acc": correct / n,
        "correct": correct,
        "n": n,
        "ci_low": lo,
        "ci_high": hi,
        "reward": float(rewards.mean()),
        "eval_tokens": num_tokens,
        "solved": "".join("1" if s else "0" for s in solved),
        **({"samples": samples} if keep_samples > 0 else {}),
    }


def heldout_pass_at_k(
    sample_fn: SampleFn,
    prompts: Sequence[Any],
    fields: Mapping[str, Sequence[Any]],
    reward_fn: Callable[..., Sequence[float]],
    *,
    samples: int,
    ks: Sequence[int],
    success_threshold: float = 1.0,
    ci_resamples: int = 10_000,
    ci_level: float = 0.95,
    ci_seed: int = 0,
) -> dict[str, Any]:
    """Unbiased pass@k (`pass_at_k`, Chen et al. 2021, Eq. 1) averaged over the problems
    `prompts`, from `samples` sampled completions of each (arguments as `heldout_accuracy`;
    1 <= k <= samples), with a percentile-bootstrap interval over problems for every k
    (`bootstrap_pass_at_k`: `ci_resamples` draws of the problems, seeded by `ci_seed`; 0 = none).

    Returns {pass_at_<k> for k in ks, pass_samples, pass_problems, pass_tokens, and when
    ci_resamples > 0: pass_at_<k>_ci = [low, high] for k in ks, pass_ci_level, pass_ci_resamples,
    pass_correct}: pass_correct lists the correct samples of every problem in order, so that two
    policies evaluated on the same problems (and sampling key) compare paired, problem by problem
    (`pass_at_k_per_problem` then `bootstrap_ci` of the difference).
    """
    n = _check(prompts, fields)
    if samples < 1 or any(not 1 <= k <= samples for k in ks):
        raise ValueError(f"heldout_pass_at_k needs samples >= 1 and 1 <= k <= {samples}, got {ks}")
    completions, num_tokens = _sample(sample_fn, n, samples, False)
    rewards = _rewards(reward_fn, prompts, fields, completions)
    correct = (rewards >= success_threshold).sum(1)
    out: dict[str, Any] = {f"pass_at_{k}": mean_pass_at_k(correct, samples, k) for k in ks}
    out["pass_samples"] = samples
    out["pass_problems"] = n
    out["pass_tokens"] = num_tokens
    if ci_resamples:
        cis = bootstrap_pass_at_k(
            correct, samples, ks, resamples=ci_resamples, level=ci_level, seed=ci_seed
        )
        out.update({f"pass_at_{k}_ci": list(cis[int(k)]) for k in ks})
        out["pass_ci_level"] = ci_level
        out["pass_ci_resamples"] = ci_resamples
        out["pass_correct"] = [int(c) for c in correct]
    return out
