"""The GGUF tokenizer cache returns a tokenizer identical to a fresh conversion."""

import pytest

from essa_jax.models import load_tokenizer


@pytest.mark.slow
def test_cached_gguf_tokenizer_equals_fresh_conversion(smollm2_gguf_path, tmp_path, monkeypatch):
    monkeypatch.setenv("ESSA_JAX_CACHE", str(tmp_path))
    fresh = load_tokenizer(smollm2_gguf_path)  # converts and writes the cache
    assert list((tmp_path / "tokenizers").iterdir()), "no cache was written"
    cached = load_tokenizer(smollm2_gguf_path)  # reads the cache
    texts = ["What is 47 + 38?", "<|im_start|>user\nhi<|im_end|>\n", "  spaces\tand 1,234.5"]
    for text in texts:
        assert cached.encode(text) == fresh.encode(text)
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    render = dict(tokenize=False, add_generation_prompt=True)
    assert cached.apply_chat_template(messages, **render) == fresh.apply_chat_template(
        messages, **render
    )
    assert (cached.eos_token_id, len(cached)) == (fresh.eos_token_id, len(fresh))

    # A broken cache is rebuilt, not trusted.
    (next((tmp_path / "tokenizers").iterdir()) / "tokenizer.json").write_text("{broken")
    assert load_tokenizer(smollm2_gguf_path).encode(texts[0]) == fresh.encode(texts[0])
