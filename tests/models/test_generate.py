"""KV-cache generation: teacher-forcing consistency, batching, EOS, sampling."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from essa_jax.models import generate_jit, pad_left

PROMPTS = [[5, 17, 9, 22, 41, 8, 30, 12], [7, 11, 13, 19, 23], [50, 2, 44, 6, 9]]
N = 10


@pytest.fixture(scope="module")
def batch():
    return pad_left(PROMPTS, pad_id=0)


@pytest.fixture(scope="module")
def greedy_out(tiny_model, batch):
    config, params = tiny_model
    tokens, mask = batch
    return generate_jit(
        params,
        config,
        tokens,
        mask,
        jax.random.key(0),
        max_new_tokens=N,
        greedy=True,
        eos_token_ids=(),
    )


def test_pad_left():
    tokens, mask = pad_left([[1, 2, 3], [4]], pad_id=9, length=4)
    np.testing.assert_array_equal(tokens, [[9, 1, 2, 3], [9, 9, 9, 4]])
    np.testing.assert_array_equal(mask, [[0, 1, 1, 1], [0, 0, 0, 1]])
    with pytest.raises(ValueError, match="longer than length"):
        pad_left([[1, 2, 3]], pad_id=0, length=2)


def test_greedy_matches_teacher_forced_forward(tiny_model, batch, greedy_out, fwd):
    """Each cached decode step picks the argmax of a full no-cache forward over the prefix."""
    config, params = tiny_model
    tokens, mask = batch
    g = greedy_out
    full = np.concatenate([tokens, np.asarray(g.tokens)], axis=1)
    full_mask = np.concatenate([mask, np.asarray(g.mask)], axis=1)
    logits = np.asarray(fwd(params, config, full, attention_mask=full_mask))
    T = tokens.shape[1]
    pred = logits[:, T - 1 : T + N - 1]
    np.testing.assert_array_equal(pred.argmax(-1), np.asarray(g.tokens))
    logp = jax.nn.log_softmax(pred, axis=-1)
    ref = np.take_along_axis(np.asarray(logp), np.asarray(g.tokens)[..., None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(g.logprobs), ref, atol=1e-4)
    assert np.all(np.asarray(g.mask) == 1) and not np.any(np.asarray(g.finished))
    np.testing.assert_array_equal(np.asarray(g.lengths), [N] * 3)


def test_batched_equals_one_by_one(tiny_model, greedy_out):
    config, params = tiny_model
    for i, p in enumerate(PROMPTS):
        alone = generate_jit(
            params,
            config,
            jnp.asarray([p]),
            jnp.ones((1, len(p)), jnp.int32),
            jax.random.key(0),
            max_new_tokens=N,
            greedy=True,
            eos_token_ids=(),
        )
        np.testing.assert_array_equal(np.asarray(alone.tokens)[0], np.asarray(greedy_out.tokens)[i])
        np.testing.assert_allclose(
            np.asarray(alone.logprobs)[0], np.asarray(greedy_out.logprobs)[i], atol=1e-4
        )


def test_eos_stops_row_and_pads(tiny_model, batch, greedy_out):
    """Make the 3rd greedy token of row 0 the EOS: row 0 ends there, other rows continue."""
    config, params = tiny_model
    tokens, mask = batch
    ref = np.asarray(greedy_out.tokens)
    eos = int(ref[0, 2])
    g = generate_jit(
        params,
        config,
        tokens,
        mask,
        jax.random.key(0),
        max_new_tokens=N,
        greedy=True,
        eos_token_ids=(eos,),
        pad_token_id=63,
    )
    out, m = np.asarray(g.tokens), np.asarray(g.mask)
    for row in range(3):
        hits = np.flatnonzero(ref[row] == eos)
        stop = hits[0] + 1 if len(hits) else N
        np.testing.assert_array_equal(out[row, :stop], ref[row, :stop])
        assert np.all(out[row, stop:] == 63)
        np.testing.assert_array_equal(m[row], np.arange(N) < stop)
        assert int(g.lengths[row]) == stop
        assert bool(g.finished[row]) == bool(len(hits))
        assert np.all(np.asarray(g.logprobs)[row, stop:] == 0.0)
    assert bool(g.finished[0]) and int(g.lengths[0]) <= 3


def test_sampling_reproducible_and_key_dependent(tiny_model, batch):
    config, params = tiny_model
    tokens, mask = batch

    def sample(seed):
        return generate_jit(
            params,
            config,
            tokens,
            mask,
            jax.random.key(seed),
            max_new_tokens=N,
            temperature=1.5,
            eos_token_ids=(),
        )

    a, b, c = sample(1), sample(1), sample(2)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    assert not np.array_equal(np.asarray(a.tokens), np.asarray(c.tokens))
    # Logprobs are under the temperature-scaled distribution, so also valid log-probabilities.
    assert np.all(np.asarray(a.logprobs) <= 0.0)


def test_top_k_1_equals_greedy(tiny_model, batch, greedy_out):
    config, params = tiny_model
    tokens, mask = batch
    g = generate_jit(
        params,
        config,
        tokens,
        mask,
        jax.random.key(5),
        max_new_tokens=N,
        top_k=1,
        top_p=0.9,
        eos_token_ids=(),
    )
    np.testing.assert_array_equal(np.asarray(g.tokens), np.asarray(greedy_out.tokens))


def test_per_row_keys_sample_like_each_row_alone(tiny_model, batch):
    """With one key per row, row b samples exactly what it samples alone with key[b]: a row's
    tokens do not depend on the batch it is in (what the population engine relies on)."""
    config, params = tiny_model
    tokens, mask = batch
    keys = jax.random.split(jax.random.key(3), len(PROMPTS))
    settings = dict(max_new_tokens=N, temperature=1.5, top_p=0.95, eos_token_ids=())
    rows = generate_jit(params, config, tokens, mask, keys, **settings)
    for b in range(len(PROMPTS)):
        alone = generate_jit(
            params, config, tokens[b : b + 1], mask[b : b + 1], keys[b], **settings
        )
        np.testing.assert_array_equal(np.asarray(rows.tokens)[b], np.asarray(alone.tokens)[0])
        np.testing.assert_allclose(
            np.asarray(rows.logprobs)[b], np.asarray(alone.logprobs)[0], atol=1e-4
        )
    # Raw uint32 keys [B, 2] are per-row keys too; the rows really get different streams.
    raw = generate_jit(params, config, tokens, mask, jax.random.key_data(keys), **settings)
    np.testing.assert_array_equal(np.asarray(raw.tokens), np.asarray(rows.tokens))
    same = generate_jit(params, config, tokens, mask, jnp.stack([keys[0]] * 3), **settings)
    assert not np.array_equal(np.asarray(same.tokens), np.asarray(rows.tokens))
    with pytest.raises(ValueError, match="one per prompt row"):
        generate_jit(params, config, tokens, mask, keys[:2], **settings)
