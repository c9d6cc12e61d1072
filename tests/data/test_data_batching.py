"""Seeded splits and the resumable batch cursor."""

import json

import numpy as np
import pytest

from essa_jax.data import (
    epoch_order,
    init_cursor,
    iterate_batches,
    next_batch,
    split_train_eval,
)


def test_resume_continues_with_the_next_batch():
    data = list(range(23))
    cursor = init_cursor(len(data), seed=11)
    full = []
    c = cursor
    for _ in range(12):  # > 5 epochs of 23 with batch 10: crosses several epoch boundaries
        batch, c = next_batch(data, c, 10)
        full.append(batch)
    c = cursor
    for _ in range(4):
        _, c = next_batch(data, c, 10)
    saved = json.loads(json.dumps(c))  # a checkpoint round trip (plain ints)
    resumed = []
    for _ in range(8):
        batch, saved = next_batch(data, saved, 10)
        resumed.append(batch)
    assert resumed == full[4:]


def test_epochs_cover_data_and_reshuffle():
    data = list(range(12))
    c = init_cursor(12, seed=0)
    batches = []
    for _ in range(6):
        b, c = next_batch(data, c, 4)
        batches.append(b)
    e0 = sum(batches[:3], [])
    e1 = sum(batches[3:], [])
    assert sorted(e0) == data and sorted(e1) == data
    assert e0 != e1
    assert e0 == list(epoch_order(12, 0, 0)) and e1 == list(epoch_order(12, 0, 1))
    assert c == {"seed": 0, "epoch": 2, "position": 0, "size": 12}


def test_batch_spanning_epochs_and_numpy_cursor():
    data = list(range(5))
    c = init_cursor(5, seed=3)
    b, c = next_batch(data, c, 3)
    b2, c2 = next_batch(data, c, 3)
    assert b2 == [
        int(epoch_order(5, 3, 0)[3]),
        int(epoch_order(5, 3, 0)[4]),
        int(epoch_order(5, 3, 1)[0]),
    ]
    assert c2["epoch"] == 1 and c2["position"] == 1
    as_arrays = {k: np.asarray(v) for k, v in c.items()}
    assert next_batch(data, as_arrays, 3) == (b2, c2)
    gen = iterate_batches(data, init_cursor(5, seed=3), 3)
    assert next(gen) == (b, c)


def test_seed_changes_order():
    a, _ = next_batch(list(range(50)), init_cursor(50, seed=1), 50)
    b, _ = next_batch(list(range(50)), init_cursor(50, seed=2), 50)
    assert a != b and sorted(a) == sorted(b)


def test_cursor_validation():
    with pytest.raises(ValueError, match="made for 10 examples"):
        next_batch(list(range(9)), init_cursor(10, seed=0), 2)
    with pytest.raises(ValueError, match="batch_size"):
        next_batch(list(range(9)), init_cursor(9, seed=0), 0)
    with pytest.raises(ValueError, match="needs int fields"):
        next_batch(list(range(9)), {"epoch": 0}, 2)
    with pytest.raises(ValueError, match="empty"):
        init_cursor(0, seed=0)


def test_split_train_eval():
    data = list(range(100))
    train, evals = split_train_eval(data, 0.1, seed=0)
    assert len(evals) == 10 and len(train) == 90
    assert sorted(train + evals) == data
    assert split_train_eval(data, 0.1, seed=0) == (train, evals)
    assert split_train_eval(data, 0.1, seed=1)[1] != evals
    assert split_train_eval(data, 0.0, seed=0) == (data, [])
    with pytest.raises(ValueError, match="eval_fraction"):
        split_train_eval(data, 1.0, seed=0)
