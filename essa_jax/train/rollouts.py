"""Prompts in, scored completions out: tokenising a task, generating, decoding, rewarding.

Shapes are fixed per run (every prompt is left-padded to the task's longest prompt), so each
generation program compiles once and is reused by SFT evaluation, ES fitness and GRPO rollouts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from essa_jax.evaluation import pass_at_k, wilson_interval
from essa_jax.models import generate_jit


@dataclasses.dataclass(frozen=True)
class PromptSet:
    """A task split, tokenised.

    prompts: rendered prompt strings (what the reward sees); tokens / mask: `[n, T]` int32,
    left-padded; fields: task fields aligned with the prompts (e.g. `answer`), passed to the reward;
    targets: SFT completion token ids per example (reference answer + EOS), may be empty.
    """

    prompts: list[str]
    tokens: np.ndarray
    mask: np.ndarray
    fields: dict[str, list[Any]]
    targets: list[list[int]]

    def __len__(self) -> int:
        return len(self.prompts)

    def take(self, idx: Sequence[int]) -> PromptSet:
        idx = list(map(int, idx))
        return PromptSet(
            prompts=[self.prompts[i] for i in idx],
            tokens=self.tokens[idx],
            mask=self.mask[idx],
            fields={k: [v[i] for i in idx] for k, v in self.fields.items()},
            targets=[self.targets[i] for i in idx] if self.targets else [],
        )

    def pad_to(self, length: int, pad_id: int) -> PromptSet:
        """The same prompts left-padded to `length` tokens (>= the current width)."""
        extra = length - self.tokens.shape[1]
        if extra < 0:
            raise ValueError(f"cannot pad {self.tokens.shape[1]}-token prompts to {length}")
        return dataclasses.replace(
            self,
            tokens=np.pad(self.tokens, ((0, 0), (extra, 0)), constant_values=pad_id),
            mask=np.pad(self.mask, ((0, 0), (extra, 0))),
        )

    def repeat(self, n: int) -> PromptSet:
        """Every prompt n times in a row (a GRPO group / pass@k samples): index i*n + j."""
        return self.take(np.repeat(np.arange(len(self)), n))


def next_indices(cursor: Any, size: int) -> tuple[np.ndarray, dict[str, jax.Array]]:
    """Indices of the next `size` training examples and the advanced cursor.

    The cursor is essa_jax.data's `{"seed", "epoch", "position", "size"}` (one shuffled order per
    epoch), held as int32 arrays in the loop state so that it is checkpointed with it: a resumed
    run sees exactly the batches an uninterrupted run sees.
    """
    from essa_jax.data import next_batch_indices

    idx, new = next_batch_indices({k: int(v) for k, v in cursor.items()}, size)
    return idx, {k: jnp.int32(v) for k, v in new.items()}


def init_cursor(num_examples: int, seed: int) -> dict[str, jax.Array]:
    """The data cursor at the start of epoch 0 (int32 arrays, a checkpointable pytree)."""
    from essa_jax.data import init_cursor as _init

    return {k: jnp.int32(v) for k, v in _init(num_examples, seed).items()}


def decode_completions(tokenizer: Any, tokens: np.ndarray, lengths: np.ndarray) -> list[str]:
    """Generated ids `[B, N]` -> strings (special tokens such as EOS dropped)."""
    return [
        tokenizer.decode([int(t) for t in row[:n]], skip_special_tokens=True)
        for row, n in zip(np.asarray(tokens), np.asarray(lengths), strict=True)
    ]


def score(
    reward_fn: Callable[..., list[float]], batch: PromptSet, completions: list[str]
) -> np.ndarray:
    """Rewards `[B]` float32 of `completions` (aligned with `batch`); maximised."""
    return np.asarray(reward_fn(batch.prompts, completions, **batch.fields), np.float32)


@dataclasses.dataclass(frozen=True)
class Sampler:
    """Generation with fixed static settings; `params` and `lora` are traced arguments."""

    model_config: Any
    max_new_tokens: int
    eos_token_ids: tuple[int, ...]
    pad_token_id: int

    def __call__(
        self,
        params: Any,
        tokens: Any,
        mask: Any,
        key: jax.Array,
        *,
        lora: Any = None,
        greedy: bool = True,
        temperature: float = 1.0,
    ):
        return generate_jit(
            params,
            self.model_config,
            tokens,
            mask,
            key,
            max_new_tokens=self.max_new_tokens,
            temperature=float(temperature),
            greedy=bool(greedy),
            lora=lora,
            eos_token_ids=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
        )


def _padded_chunks(n: int, batch_size: int) -> list[np.ndarray]:
    """Index chunks of exactly `batch_size` (the last one padded with index 0): one compile."""
    chunks = []
    for start in range(0, n, batch_size):
        idx = np.arange(start, min(start + batch_size, n))
        chunks.append(np.concatenate([idx, np.zeros(batch_size - len(idx), np.int64)]))
    return chunks


def generate_all(
    sampler: Sampler,
    tokenizer: Any,
    params: Any,
    data: PromptSet,
    key: jax.Array,
    *,
    batch_size: int,
    lora: Any = None,
    greedy: bool = True,
    temperature: float = 1.0,
) -> tuple[list[str], int]:
    """Completions of every prompt of `data` (in order) and the number of generated tokens."""
    batch_size = min(batch_size, len(data))
    completions: list[str] = []
    tokens = 0
    for c, idx in enumerate(_padded_chunks(len(data), batch_size)):
        real = len(data) - c * batch_size
        out = sampler(
            params,
            data.tokens[idx],
            data.mask[idx],
            jax.random.fold_in(key, c),
            lora=lora,
            greedy=greedy,
            temperature=temperature,
        )
        lengths = np.asarray(out.lengths)[: min(real, batch_size)]
        completions += decode_completions(tokenizer, np.asarray(out.tokens), lengths)
        tokens += int(lengths.sum())
    return completions, tokens


def heldout_accuracy(
    sampler: Sampler,
    tokenizer: Any,
    reward_fn: Callable[..., list[float]],
    params: Any,
    data: PromptSet,
    *,
    batch_size: int,
    lora: Any = None,
) -> dict[str, float]:
    """Greedy accuracy on `data`: {acc, correct, n, ci_low, ci_high, reward, eval_tokens, solved}.

    A problem counts as correct when its reward is >= 1 (the 1.0 / 0.0 verifiable rewards); the CI
    is 95% Wilson. `solved` is a string of n "0"/"1" (problem order), kept so that two policies
    evaluated on the same set compare paired (`essa_jax.evaluation.mcnemar_exact`).
    """
    completions, tokens = generate_all(
        sampler, tokenizer, params, data, jax.random.PRNGKey(0), batch_size=batch_size, lora=lora
    )
    rewards = score(reward_fn, data, completions)
    correct = int(np.sum(rewards >= 1.0))
    n = len(data)
    lo, hi = wilson_interval(correct, n)
    return {
        "acc": correct / n,
        "correct": correct,
        "n": n,
        "ci_low": lo,
        "ci_high": hi,
        "reward": float(rewards.mean()),
        "eval_tokens": tokens,
        "solved": "".join("1" if r >= 1.0 else "0" for r in rewards),
    }


def heldout_pass_at_k(
    sampler: Sampler,
    tokenizer: Any,
    reward_fn: Callable[..., list[float]],
    params: Any,
    data: PromptSet,
    key: jax.Array,
    *,
    samples: int,
    ks: Sequence[int],
    batch_size: int,
    temperature: float = 1.0,
    lora: Any = None,
) -> dict[str, float]:
    """Mean pass@k over the problems of `data`, `samples` samples each at `temperature`."""
    rep = data.repeat(samples)
    completions, tokens = generate_all(
        sampler,
        tokenizer,
        params,
        rep,
        key,
        batch_size=batch_size,
        lora=lora,
        greedy=False,
        temperature=temperature,
    )
    correct = (score(reward_fn, rep, completions) >= 1.0).reshape(len(data), samples).sum(1)
    out = {
        f"pass_at_{k}": float(np.mean([pass_at_k(samples, int(c), k) for c in correct])) for k in ks
    }
    out["pass_samples"] = samples
    out["pass_problems"] = len(data)
    out["pass_tokens"] = tokens
    return out
