"""The real embedded model (SmolLM2-135M-Instruct GGUF) against transformers on the same file."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from essa_jax.models import forward, generate_jit, load_pretrained, load_tokenizer, pad_left

pytestmark = pytest.mark.slow

QUESTIONS = [
    "What is 12 + 35?",
    "Name a colour.",
    "Write one sentence about the sea.",
    "What is 7 times 8? Answer with just the number.",
    "Hi",
]


@pytest.fixture(scope="module")
def ours(smollm2_gguf_path):
    return load_pretrained(smollm2_gguf_path)


@pytest.fixture(scope="module")
def tokenizer(smollm2_gguf_path):
    return load_tokenizer(smollm2_gguf_path)


@pytest.fixture(scope="module")
def hf_model(smollm2_gguf_path):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        smollm2_gguf_path.parent, gguf_file=smollm2_gguf_path.name, dtype=torch.float32
    )
    return model.eval()


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=True, add_generation_prompt=True
        )
        for q in QUESTIONS
    ]


def _ids(p):
    return list(p["input_ids"]) if isinstance(p, dict) or hasattr(p, "keys") else list(p)


def test_config_and_tokenizer(ours, tokenizer, prompts):
    config, _ = ours
    assert (config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads) == (
        30,
        576,
        9,
        3,
    )
    assert config.tie_embeddings and config.eos_token_ids == (2,) and config.vocab_size == 49152
    ids = _ids(prompts[0])
    assert ids[0] == 1 and tokenizer.decode(ids).startswith("<|im_start|>system")
    assert tokenizer.decode(ids).endswith("<|im_start|>assistant\n")


def test_logits_match_transformers(ours, hf_model, prompts):
    import torch

    config, params = ours
    fwd = jax.jit(forward, static_argnums=1)
    for p in prompts[:3]:
        ids = np.asarray([_ids(p)])
        with torch.no_grad():
            ref = hf_model(torch.as_tensor(ids)).logits.numpy()
        got = np.asarray(fwd(params, config, jnp.asarray(ids)))
        np.testing.assert_allclose(got, ref, atol=1e-3, rtol=0)


def test_greedy_generation_matches_transformers(ours, hf_model, prompts):
    import torch

    config, params = ours
    rows = [_ids(p) for p in prompts]
    assert len({len(r) for r in rows}) > 1  # different prompt lengths in one batch
    tokens, mask = pad_left(rows, pad_id=config.effective_pad_id)
    g = generate_jit(
        params, config, tokens, mask, jax.random.key(0), max_new_tokens=20, greedy=True
    )
    for i, r in enumerate(rows):
        with torch.no_grad():
            out = hf_model.generate(
                torch.as_tensor([r]),
                max_new_tokens=20,
                do_sample=False,
                eos_token_id=2,
                pad_token_id=2,
            )[0, len(r) :].numpy()
        n = int(g.lengths[i])
        assert n == len(out), (i, np.asarray(g.tokens[i]), out)
        np.testing.assert_array_equal(np.asarray(g.tokens[i, :n]), out)


def test_tokenizer_roundtrip_through_hf_dir(tokenizer, prompts, tmp_path):
    """A tokenizer saved as an HF directory loads back (local files only) and agrees."""
    tokenizer.save_pretrained(tmp_path)
    again = load_tokenizer(tmp_path)
    ids = again.apply_chat_template(
        [{"role": "user", "content": QUESTIONS[0]}], tokenize=True, add_generation_prompt=True
    )
    assert _ids(ids) == _ids(prompts[0])
    text = "What is 123 + 4?"
    assert again.encode(text) == tokenizer.encode(text)
    assert tokenizer.decode(tokenizer.encode(text)) == text
