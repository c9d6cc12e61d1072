"""Prompt building and token-length handling."""

import jinja2
import pytest

from essa_jax.data import (
    PAPER_SYSTEM_PROMPT,
    build_prompt,
    encode_prompt_completion,
    encode_prompts,
    generate_task,
    prompt_token_ids,
)

# SmolLM2-135M-Instruct's chat template, as stored in its GGUF metadata.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ChatMLCharTokenizer:
    """HF-like tokenizer: the real SmolLM2 template, one token per character (ids = code points)."""

    def __init__(self):
        self.template = jinja2.Environment().from_string(SMOLLM2_TEMPLATE)

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        assert tokenize is False
        return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt)

    def encode(self, text, add_special_tokens=True):
        return [ord(ch) for ch in text]


@pytest.fixture
def tok():
    return ChatMLCharTokenizer()


EX = {"id": "add_2d:23+45", "question": "What is 23 + 45?", "answer": "68", "prefill": "23 + 45 = "}


def test_prefill_format_default_system(tok):
    text = build_prompt(EX, tok, format="prefill")
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nWhat is 23 + 45?<|im_end|>\n"
        "<|im_start|>assistant\n23 + 45 = "
    )


def test_assistant_format_is_the_header_and_the_prefill(tok):
    assert build_prompt(EX, tok, format="assistant") == "<|im_start|>assistant\n23 + 45 = "
    # The system prompt and instruction belong to turns this format leaves out.
    text = build_prompt(EX, tok, format="assistant", system_prompt="S", instruction=" I")
    assert text == "<|im_start|>assistant\n23 + 45 = "
    with pytest.raises(ValueError, match="'assistant' needs a 'prefill'"):
        build_prompt({"id": "w1", "question": "q"}, tok, format="assistant")

    class NoHeader(ChatMLCharTokenizer):
        def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
            return super().apply_chat_template(messages, tokenize, add_generation_prompt=False)

    with pytest.raises(ValueError, match="assistant header"):
        build_prompt(EX, NoHeader(), format="assistant")


def test_chat_format_explicit_system_and_instruction(tok):
    text = build_prompt(
        EX,
        tok,
        format="chat",
        system_prompt=PAPER_SYSTEM_PROMPT,
        instruction=" Answer with just the number.",
    )
    assert text == (
        "<|im_start|>system\nPlease reason step by step and place your final answer in "
        "\\boxed{}.<|im_end|>\n<|im_start|>user\nWhat is 23 + 45? Answer with just the "
        "number.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert "SmolLM" not in text


def test_plain_and_few_shot():
    assert build_prompt({"question": "What is 2+2?"}, format="plain") == (
        "Question: What is 2+2?\nAnswer:"
    )
    shots = [{"question": "What is 1 + 2?", "answer": "3", "prefill": "1 + 2 = "}]
    assert build_prompt(EX, format="few_shot", shots=shots) == (
        "Question: What is 1 + 2?\nAnswer: 1 + 2 = 3\n\nQuestion: What is 23 + 45?\n"
        "Answer: 23 + 45 = "
    )
    gsm_shot = [{"question": "Q1", "answer": "7", "solution": "3 + 4 = 7"}]
    assert build_prompt({"question": "Q2"}, format="few_shot", shots=gsm_shot) == (
        "Question: Q1\nAnswer: 3 + 4 = 7\nThe answer is 7.\n\nQuestion: Q2\nAnswer:"
    )


def test_chat_messages_example(tok):
    ex = {"question": "hi", "messages": [{"role": "user", "content": "hi"}]}
    text = build_prompt(ex, tok, format="chat", system_prompt="S")
    assert (
        text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_prompt_errors(tok):
    with pytest.raises(ValueError, match="prefill"):
        build_prompt({"id": "w1", "question": "q"}, tok, format="prefill")
    with pytest.raises(ValueError, match="apply_chat_template"):
        build_prompt(EX, None, format="chat")
    with pytest.raises(ValueError, match="valid"):
        build_prompt(EX, tok, format="chatml")
    with pytest.raises(ValueError, match="shots"):
        build_prompt(EX, format="few_shot")


def test_prompt_token_ids_generated_task(tok):
    _, evals = generate_task("add_2d", num_train=0, num_eval=8, seed=0)
    batch = prompt_token_ids(evals, tok, format="prefill")
    assert len(batch.token_ids) == 8 and batch.report.count == 0
    for ids, text, ex in zip(batch.token_ids, batch.texts, batch.examples, strict=True):
        assert ids == [ord(c) for c in text]
        assert text.endswith(ex["prefill"])


def test_too_long_prompts_reported_not_silently_cut(tok):
    exs = [
        {"id": "short", "question": "2+2?"},
        {"id": "long", "question": "x" * 200},
        {"id": "short2", "question": "3+3?"},
    ]
    limit = len(build_prompt(exs[0], tok, format="chat")) + 5
    with pytest.raises(ValueError, match=r"1 prompts exceed 157 tokens .* long \(348\)"):
        prompt_token_ids(exs, tok, format="chat", max_prompt_tokens=limit)
    skipped = prompt_token_ids(exs, tok, format="chat", max_prompt_tokens=limit, on_too_long="skip")
    assert [e["id"] for e in skipped.examples] == ["short", "short2"]
    assert skipped.report.ids == ["long"] and skipped.report.kept_indices == [0, 2]
    cut = prompt_token_ids(
        exs, tok, format="chat", max_prompt_tokens=limit, on_too_long="truncate_left"
    )
    long_ids = cut.token_ids[1]
    assert len(long_ids) == limit
    # The start (system prompt) goes; the end of the question and the assistant header stay.
    assert "".join(map(chr, long_ids)).endswith("xxx<|im_end|>\n<|im_start|>assistant\n")
    assert cut.report.count == 1


def test_encode_prompts_limit_validation(tok):
    with pytest.raises(ValueError, match="on_too_long"):
        encode_prompts(["a"], tok, on_too_long="cut")


def test_encode_prompt_completion_never_cuts_answer(tok):
    ids, mask = encode_prompt_completion("abcdef", "42", tok, max_tokens=5)
    assert ids == [ord(c) for c in "def42"] and mask == [0, 0, 0, 1, 1]
    with pytest.raises(ValueError, match="never truncated"):
        encode_prompt_completion("abc", "123456", tok, max_tokens=5)


@pytest.mark.slow
def test_real_smollm2_tokenizer_prefill(smollm2_gguf_path):
    from essa_jax.models import load_tokenizer

    tokenizer = load_tokenizer(smollm2_gguf_path)
    batch = prompt_token_ids([EX], tokenizer, format="prefill", max_prompt_tokens=64)
    ids = batch.token_ids[0]
    tail = tokenizer.convert_ids_to_tokens(ids[-8:])
    assert tail == ["2", "3", "Ġ+", "Ġ", "4", "5", "Ġ=", "Ġ"]  # digits are one token each
    assert ids[0] == 1  # <|im_start|>, from the template; no extra BOS added
    assert len(ids) == 48
    short = prompt_token_ids([EX], tokenizer, format="assistant").token_ids[0]
    assert short[0] == 1 and short[-8:] == ids[-8:] and len(short) == 12
    assert tokenizer.decode(short) == "<|im_start|>assistant\n23 + 45 = "
