"""Prompts in, completions out: a tokenised task split, the data cursor, generation and decoding.

Shapes are fixed per run (every prompt is left-padded to the task's longest prompt), so each
generation program compiles once and is reused by SFT evaluation, ES fitness and GRPO rollouts.
`policy_sample_fn` is the model side of the held-out evaluation (`essa_jax.evaluation`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from essa_jax.evaluation import SampleFn
from essa_jax.models import decode_completions, generate_jit


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
    """Completions of every prompt of `data` (in order) and the number of generated tokens.

    Chunks of exactly `batch_size` rows (the last one padded) with keys fold_in(key, chunk).
    """
    batch_size = min(batch_size, len(data))
    completions: list[str] = []
    tokens = 0
    for c, idx in enumerate(_padded_chunks(len(data), batch_size)):
        real = min(len(data) - c * batch_size, batch_size)
        out = sampler(
            params,
            data.tokens[idx],
            data.mask[idx],
            jax.random.fold_in(key, c),
            lora=lora,
            greedy=greedy,
            temperature=temperature,
        )
        lengths = np.asarray(out.lengths)[:real]
        completions += decode_completions(
            tokenizer, np.asarray(out.tokens)[:real], lengths, sampler.eos_token_ids
        )
        tokens += int(lengths.sum())
    return completions, tokens


def policy_sample_fn(
    sampler: Sampler,
    tokenizer: Any,
    params: Any,
    data: PromptSet,
    key: jax.Array,
    *,
    batch_size: int,
    lora: Any = None,
    temperature: float = 1.0,
) -> SampleFn:
    """The model side of `essa_jax.evaluation` for the prompts of `data`: `sample(num_samples,
    greedy)` generates every prompt `num_samples` times in a row (`data.repeat`) with
    `generate_all` and returns (completions [prompt][sample], generated tokens)."""

    def sample(num_samples: int, greedy: bool) -> tuple[list[list[str]], int]:
        rows = data if num_samples == 1 else data.repeat(num_samples)
        flat, tokens = generate_all(
            sampler,
            tokenizer,
            params,
            rows,
            key,
            batch_size=batch_size,
            lora=lora,
            greedy=greedy,
            temperature=temperature,
        )
        return [flat[i : i + num_samples] for i in range(0, len(flat), num_samples)], tokens

    return sample
