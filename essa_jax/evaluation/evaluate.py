"""Evaluate a model on a held-out set through a sampling callable (no model internals here).

The model side is a `sample_fn(prompt_token_lists, num_samples, greedy) -> list[list[str]]`: for
each prompt (a list of token ids, unpadded), `num_samples` completion strings. A plain model, an
adapter, or one member of an ESSA population all fit behind it.

Metrics (maximised): greedy accuracy with a Wilson 95% interval; from `num_samples` = n samples per
problem: avg@n with a normal 95% interval over problems, unbiased pass@k for k = 1, 2, 4, ... up to
n, and the fraction of problems whose samples are all right, all wrong, or mixed (mixed problems
are the ones that give GRPO / ESSA a learning signal).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from essa_jax.rewards import guard_reward, math_reward

from .metrics import avg_at_k, ks_up_to, mean_interval, mean_pass_at_k, wilson_interval

SampleFn = Callable[[list[list[int]], int, bool], list[list[str]]]


def _task_fields(examples: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Fields present in every example, as lists aligned with the examples."""
    if not examples:
        return {}
    common = set(examples[0]).intersection(*(set(e) for e in examples[1:]))
    return {k: [e[k] for e in examples] for k in sorted(common)}


def _sample(sample_fn: SampleFn, tokens, num: int, greedy: bool) -> list[list[str]]:
    out = sample_fn([list(t) for t in tokens], num, greedy)
    if len(out) != len(tokens) or any(len(o) != num for o in out):
        shape = [len(o) for o in out][:5]
        raise ValueError(
            f"sample_fn returned {len(out)} prompt entries with {shape}... completions; expected "
            f"{len(tokens)} entries of {num} completions each (greedy={greedy})"
        )
    return [[str(c) for c in o] for o in out]


def evaluate(
    sample_fn: SampleFn,
    examples: Sequence[Mapping[str, Any]],
    prompt_token_ids: Sequence[Sequence[int]],
    *,
    reward_fn: Callable[..., list[float]] = math_reward,
    num_samples: int = 0,
    greedy: bool = True,
    batch_size: int = 64,
    prompts: Sequence[str] | None = None,
    success_threshold: float = 1.0,
    reward_timeout_s: float | None = 30.0,
    return_details: bool = False,
) -> dict[str, Any]:
    """Metrics of a model on `examples` (one prompt each), batched through `sample_fn`.

    Args:
      sample_fn: `(prompt_token_lists, num_samples, greedy) -> completions[prompt][sample]`.
      examples: normalised examples; every field common to all of them is passed to `reward_fn`.
      prompt_token_ids: one token id list per example (e.g. `prompt_token_ids(...).token_ids`).
      reward_fn: `fn(prompts, completions, **fields) -> list[float]`; guarded, so a failing or
        hanging reward scores 0.0 and is counted (`reward_failures`, `reward_timeouts`).
      num_samples: n sampled completions per problem for avg@n / pass@k (0: none).
      greedy: also decode greedily once per problem for `accuracy`.
      batch_size: prompts per `sample_fn` call.
      prompts: prompt strings given to the reward (default: each example's question).
      success_threshold: a completion is correct when its reward >= this.
      return_details: add per-problem `details` (completions, rewards, correct counts).

    Returns a dict: num_problems, accuracy, accuracy_ci_low/high (Wilson 95%), and with
    num_samples = n > 0: num_samples, avg@n, avg@n_ci_low/high, pass@k for k in 1, 2, 4, ..., n,
    frac_all_correct, frac_none_correct, frac_mixed, mean_reward; mean_completion_chars, reward
    failure counts.
    """
    if len(examples) != len(prompt_token_ids):
        raise ValueError(f"{len(examples)} examples but {len(prompt_token_ids)} prompt token lists")
    if not examples:
        raise ValueError("evaluate needs at least one example")
    if not greedy and num_samples <= 0:
        raise ValueError("nothing to evaluate: greedy=False and num_samples=0")
    if num_samples < 0 or batch_size <= 0:
        raise ValueError(
            f"num_samples must be >= 0 and batch_size > 0 ({num_samples}, {batch_size})"
        )
    reward = guard_reward(reward_fn, timeout_s=reward_timeout_s)
    texts = list(prompts) if prompts is not None else [str(e["question"]) for e in examples]
    num_problems = len(examples)
    greedy_rewards: list[float] = []
    greedy_completions: list[str] = []
    sample_rewards: list[list[float]] = []
    sample_completions: list[list[str]] = []
    lengths: list[int] = []
    for start in range(0, num_problems, batch_size):
        stop = min(start + batch_size, num_problems)
        batch = examples[start:stop]
        tokens = prompt_token_ids[start:stop]
        fields = _task_fields(batch)
        if greedy:
            comps = [o[0] for o in _sample(sample_fn, tokens, 1, True)]
            greedy_completions += comps
            greedy_rewards += reward(texts[start:stop], comps, **fields)
            lengths += [len(c) for c in comps]
        if num_samples:
            outs = _sample(sample_fn, tokens, num_samples, False)
            flat = [c for o in outs for c in o]
            rep = {k: [v for v in vals for _ in range(num_samples)] for k, vals in fields.items()}
            flat_prompts = [p for p in texts[start:stop] for _ in range(num_samples)]
            r = reward(flat_prompts, flat, **rep)
            sample_rewards += [r[i * num_samples : (i + 1) * num_samples] for i in range(len(outs))]
            sample_completions += outs
            lengths += [len(c) for c in flat]

    result: dict[str, Any] = {"num_problems": num_problems}
    if greedy:
        correct = int(sum(r >= success_threshold for r in greedy_rewards))
        low, high = wilson_interval(correct, num_problems)
        result.update(accuracy=correct / num_problems, accuracy_ci_low=low, accuracy_ci_high=high)
    if num_samples:
        n = num_samples
        counts = [int(sum(r >= success_threshold for r in rs)) for rs in sample_rewards]
        per_problem = [c / n for c in counts]
        low, high = mean_interval(per_problem)
        result["num_samples"] = n
        result[f"avg@{n}"] = avg_at_k(counts, n)
        result[f"avg@{n}_ci_low"], result[f"avg@{n}_ci_high"] = low, high
        for k in ks_up_to(n):
            result[f"pass@{k}"] = mean_pass_at_k(counts, n, k)
        result["frac_all_correct"] = float(np.mean([c == n for c in counts]))
        result["frac_none_correct"] = float(np.mean([c == 0 for c in counts]))
        result["frac_mixed"] = float(np.mean([0 < c < n for c in counts]))
        result["mean_reward"] = float(np.mean(sample_rewards))
    result["mean_completion_chars"] = float(np.mean(lengths))
    result["reward_failures"] = reward.stats.failures
    result["reward_timeouts"] = reward.stats.timeouts
    if return_details:
        details = []
        for i, ex in enumerate(examples):
            d: dict[str, Any] = {"id": ex.get("id", i), "answer": ex.get("answer")}
            if greedy:
                d["greedy_completion"] = greedy_completions[i]
                d["greedy_reward"] = greedy_rewards[i]
            if num_samples:
                d["completions"] = sample_completions[i]
                d["rewards"] = sample_rewards[i]
            details.append(d)
        result["details"] = details
    return result


def evaluate_task(
    sample_fn: SampleFn,
    task: Any,
    tokenizer: Any,
    *,
    max_prompt_tokens: int | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """`evaluate` on `task.eval` (a `essa_jax.data.Task`), with its prompt format and reward."""
    from essa_jax.data import prompt_token_ids
    from essa_jax.rewards import get_reward

    batch = prompt_token_ids(
        task.eval, tokenizer, max_prompt_tokens=max_prompt_tokens, **task.prompt_kwargs()
    )
    kwargs.setdefault("reward_fn", get_reward(task.reward))
    result = evaluate(sample_fn, batch.examples, batch.token_ids, prompts=batch.texts, **kwargs)
    result["prompts_too_long"] = batch.report.count
    return result
