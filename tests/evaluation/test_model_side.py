"""The model side of held-out evaluation: `essa_jax.models.decode_completions` and the train
layer's `policy_sample_fn` (generation in fixed padded chunks), with a fake generator."""

import dataclasses

import jax
import numpy as np
import pytest

from essa_jax.models import decode_completions, pad_left
from essa_jax.train.rollouts import PromptSet, policy_sample_fn

try:
    from essa_jax.models import CharTokenizer
except ImportError:  # the tiny backend before its move to essa_jax.models
    from essa_jax.train.tiny import CharTokenizer

EOS, PAD = 2, 0


def test_decode_completions_drops_pad_tail_and_final_eos():
    tok = CharTokenizer()
    a, b = tok.encode("12"), tok.encode("x<|im_end|>y")
    tokens = np.full((3, 6), PAD, np.int32)
    tokens[0, :3] = a + [EOS]  # finished: "12" + EOS
    tokens[1, :3] = b  # an EOS inside is kept (the tokenizer skips it as a special token)
    tokens[2, :2] = a  # truncated
    lengths = np.array([3, 3, 1])
    assert decode_completions(tok, tokens, lengths, (EOS,)) == ["12", "xy", "1"]
    # A callable sees the ids themselves: only the final EOS and the tail are gone.
    assert decode_completions(lambda ids: ids, tokens, lengths, (EOS,)) == [a, b, a[:1]]
    assert decode_completions(lambda ids: ids, tokens, lengths) == [a + [EOS], b, a[:1]]
    # [P, B, N] -> [P][B], and [N] -> one string.
    nested = decode_completions(
        tok, np.stack([tokens, tokens[::-1]]), np.stack([lengths, lengths[::-1]])
    )
    assert nested == [["12", "xy", "1"], ["1", "xy", "12"]]
    assert decode_completions(tok, tokens[0], lengths[0], (EOS,)) == "12"
    assert decode_completions(tok, tokens[:0], lengths[:0]) == []
    with pytest.raises(ValueError, match="tokens"):
        decode_completions(tok, tokens, lengths[:2])


@dataclasses.dataclass
class FakeGeneration:
    tokens: np.ndarray
    lengths: np.ndarray


class FakeSampler:
    """Completion of a row: its last prompt token, then one id from the key, then EOS (except on
    rows whose prompt ends with "5": truncated at 3 tokens). Records every call's rows and key."""

    eos_token_ids = (EOS,)

    def __init__(self):
        self.calls = []

    def __call__(self, params, tokens, mask, key, *, lora=None, greedy=True, temperature=1.0):
        self.calls.append((tokens.shape, np.asarray(jax.random.key_data(key)).tolist(), greedy))
        k = int(jax.random.randint(key, (), 3, 12))
        out = np.full((tokens.shape[0], 4), PAD, np.int32)
        lengths = np.zeros(tokens.shape[0], np.int32)
        for i, row in enumerate(tokens):
            truncated = row[-1] == CharTokenizer().encode("5")[0]
            ids = [row[-1], k, row[-1]] if truncated else [row[-1], k, EOS]
            out[i, : len(ids)] = ids
            lengths[i] = len(ids)
        return FakeGeneration(out, lengths)


def _prompts(n):
    tok = CharTokenizer()
    texts = [f"q{i}" for i in range(n)]
    tokens, mask = pad_left([tok.encode(t) for t in texts], PAD)
    return tok, PromptSet(texts, np.asarray(tokens), np.asarray(mask), {"i": list(range(n))}, [])


@pytest.mark.parametrize(
    ("num_prompts", "samples", "batch_size"), [(7, 1, 3), (6, 3, 4), (2, 2, 8)]
)
def test_policy_sample_fn_fixed_chunks_and_order(num_prompts, samples, batch_size):
    tok, data = _prompts(num_prompts)
    sampler = FakeSampler()
    key = jax.random.PRNGKey(5)
    sample = policy_sample_fn(sampler, tok, None, data, key, batch_size=batch_size)
    completions, tokens = sample(samples, samples == 1)
    rows = num_prompts * samples
    width = min(batch_size, rows)
    # Every generate call has exactly `width` rows (one compile), keys fold_in(key, chunk).
    assert [c[0][0] for c in sampler.calls] == [width] * -(-rows // width)
    keys = [np.asarray(jax.random.fold_in(key, c)).tolist() for c in range(len(sampler.calls))]
    assert [c[1] for c in sampler.calls] == keys
    assert len(completions) == num_prompts and all(len(c) == samples for c in completions)
    for i, comps in enumerate(completions):
        last = f"q{i}"[-1]
        for s in comps:  # "<last char><key char>" (+ "<last char>" when truncated)
            assert s[0] == last and len(s) == (3 if last == "5" else 2)
    truncated = sum(samples for i in range(num_prompts) if f"q{i}".endswith("5"))
    assert tokens == 3 * rows  # EOS counted, padded rows not
    assert sum(len(s) for c in completions for s in c) == 2 * rows + truncated
