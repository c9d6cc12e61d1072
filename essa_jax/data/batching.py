"""Seeded train / eval splits and resumable per-step mini-batches.

The position in the training stream is a *cursor*: a small dict of ints
`{"seed", "epoch", "position", "size"}` (a pytree; save it with the rest of the training state).
Epoch e visits the examples in the order `permutation(size)` drawn from
`np.random.default_rng([seed, e])`, so every epoch is reshuffled, deterministically, and a cursor
restored from a checkpoint continues with exactly the batch that would have come next. A batch that
reaches the end of an epoch is completed from the start of the next one (every batch is full).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")
Cursor = dict[str, int]
_CURSOR_KEYS = ("seed", "epoch", "position", "size")


def split_train_eval(
    examples: Sequence[T], eval_fraction: float, seed: int
) -> tuple[list[T], list[T]]:
    """Seeded held-out split: `round(eval_fraction * n)` examples (at least 1) go to eval.

    The split is a fixed permutation of the input order for a given seed, so it does not depend on
    anything else in the config.
    """
    if not 0.0 <= eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
    n = len(examples)
    if eval_fraction == 0.0:
        return list(examples), []
    n_eval = max(1, round(eval_fraction * n))
    if n_eval >= n:
        raise ValueError(
            f"eval_fraction={eval_fraction} of {n} examples leaves no training examples"
        )
    order = np.random.default_rng([seed, 0x5E1]).permutation(n)
    eval_idx = np.sort(order[:n_eval])
    train_idx = np.sort(order[n_eval:])
    return [examples[i] for i in train_idx], [examples[i] for i in eval_idx]


_COMMUTATIVE = re.compile(r"^\s*(-?\d+)\s*([+*])\s*(-?\d+)\s*$")


def canonical_key(example: dict[str, Any]) -> str:
    """The problem an example poses, up to presentation: the operands of a commutative binary
    expression sorted ("27 + 45" and "45 + 27" are one problem), else the expression, else the
    question text with whitespace and case normalised. Two examples with one key would leak
    between splits (a model that memorised "a + b" in training answers "b + a" at test)."""
    expr = example.get("expression")
    if isinstance(expr, str):
        m = _COMMUTATIVE.match(expr)
        if m:
            a, op, b = m.groups()
            a, b = sorted((int(a), int(b)))
            return f"{a} {op} {b}"
        return " ".join(expr.split())
    text = example.get("question", example.get("prompt", ""))
    return " ".join(str(text).lower().split())


def prompt_key(example: dict[str, Any]) -> str:
    """The prompt an example poses, as the model reads it up to whitespace and case: every turn
    of its chat `messages` when it has them, else its question. Unlike `canonical_key` it does
    not identify "a + b" with "b + a": two examples with one `prompt_key` are the same prompt,
    which a held-out set must never share with training (`remove_heldout_duplicates`)."""
    messages = example.get("messages")
    if isinstance(messages, list) and messages:
        text = " | ".join(f"{m.get('role')}: {m.get('content')}" for m in messages)
    else:
        text = str(example.get("question", example.get("prompt", "")))
    return " ".join(text.lower().split())


def remove_heldout_duplicates(
    train: Sequence[T], heldout: Sequence[dict[str, Any]], limit: int | None = None
) -> tuple[list[T], int]:
    """(train without the examples whose `prompt_key` a held-out example has, removed count).

    With `limit`, at most `limit` examples are kept (the first ones that are not duplicates) and
    only the duplicates met before the limit is reached are counted: the examples a duplicate
    displaced from a training set of `limit`. The held-out examples are never changed, so the
    evaluation set is the one the config names."""
    seen = {prompt_key(ex) for ex in heldout}
    kept: list[T] = []
    removed = 0
    for ex in train:
        if limit is not None and len(kept) >= limit:
            break
        if prompt_key(ex) in seen:  # type: ignore[arg-type]
            removed += 1
        else:
            kept.append(ex)
    return kept, removed


def disjoint_splits(
    test: Sequence[dict[str, Any]],
    validation: Sequence[dict[str, Any]],
    train: Sequence[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, int]]:
    """(validation, train, removed) with every example whose `canonical_key` already appears in
    an earlier split (test, then validation) or earlier in its own split removed: the test set is
    never changed, so results stay comparable with runs that had no validation split.
    `removed` counts what was dropped: {"validation": n, "train": m}."""
    seen = {canonical_key(ex) for ex in test}
    out: list[list[dict[str, Any]]] = []
    removed: dict[str, int] = {}
    for name, split in (("validation", validation), ("train", train)):
        kept = []
        for ex in split:
            key = canonical_key(ex)
            if key not in seen:
                seen.add(key)
                kept.append(ex)
        removed[name] = len(split) - len(kept)
        out.append(kept)
    return out[0], out[1], removed


def check_disjoint(splits: dict[str, Sequence[dict[str, Any]]]) -> None:
    """Raise ValueError naming the first problem that two splits share (by `canonical_key`)."""
    owner: dict[str, str] = {}
    for name, split in splits.items():
        for ex in split:
            key = canonical_key(ex)
            other = owner.setdefault(key, name)
            if other != name:
                raise ValueError(
                    f"splits {other!r} and {name!r} share the problem {key!r}; the splits of a "
                    "study must be disjoint"
                )


def init_cursor(num_examples: int, seed: int) -> Cursor:
    """The cursor at the start of epoch 0 for a dataset of `num_examples` examples."""
    if num_examples <= 0:
        raise ValueError(f"cannot batch an empty dataset (num_examples={num_examples})")
    return {"seed": int(seed), "epoch": 0, "position": 0, "size": int(num_examples)}


def _as_cursor(cursor: Any, num_examples: int) -> Cursor:
    try:
        c = {k: int(np.asarray(cursor[k])) for k in _CURSOR_KEYS}
    except (KeyError, TypeError) as e:
        raise ValueError(f"a batch cursor needs int fields {_CURSOR_KEYS}, got {cursor!r}") from e
    if c["size"] != num_examples:
        raise ValueError(
            f"cursor was made for {c['size']} examples but the dataset has {num_examples}; "
            "resume with the same training set"
        )
    if not 0 <= c["position"] < num_examples or c["epoch"] < 0:
        raise ValueError(f"cursor {c} is out of range for {num_examples} examples")
    return c


def epoch_order(num_examples: int, seed: int, epoch: int) -> np.ndarray:
    """The visiting order of epoch `epoch`: a permutation of range(num_examples)."""
    return np.random.default_rng([int(seed), int(epoch)]).permutation(num_examples)


def next_batch_indices(cursor: Cursor, batch_size: int) -> tuple[np.ndarray, Cursor]:
    """Indices of the next `batch_size` examples and the advanced cursor (pure)."""
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    c = _as_cursor(cursor, int(np.asarray(cursor["size"])))
    n = c["size"]
    out = []
    epoch, pos = c["epoch"], c["position"]
    need = batch_size
    while need:
        order = epoch_order(n, c["seed"], epoch)
        take = order[pos : pos + need]
        out.append(take)
        need -= len(take)
        pos += len(take)
        if pos == n:
            epoch, pos = epoch + 1, 0
    new = {"seed": c["seed"], "epoch": epoch, "position": pos, "size": n}
    return np.concatenate(out), new


def next_batch(examples: Sequence[T], cursor: Cursor, batch_size: int) -> tuple[list[T], Cursor]:
    """The next mini-batch of `examples` and the advanced cursor (pure: the input is unchanged)."""
    _as_cursor(cursor, len(examples))
    idx, new = next_batch_indices(cursor, batch_size)
    return [examples[i] for i in idx], new


def iterate_batches(
    examples: Sequence[T], cursor: Cursor, batch_size: int
) -> Iterator[tuple[list[T], Cursor]]:
    """Endless (batch, cursor after it) pairs; save the cursor of the last consumed batch."""
    while True:
        batch, cursor = next_batch(examples, cursor, batch_size)
        yield batch, cursor
