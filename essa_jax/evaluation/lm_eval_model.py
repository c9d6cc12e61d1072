"""Our model (+ a trained adapter) as an lm-eval `LM`: any lm-eval benchmark evaluates a run.

lm-eval (EleutherAI's evaluation harness, `pip install 'essa_jax[lmeval]'`) asks a model for three
things, which this class answers with the library's own functions:

- `generate_until((context, gen_kwargs))`: `models.generate_jit` on the left-padded contexts, greedy
  unless `do_sample` with a temperature > 0; each completion is cut at the first `until` string
  (as lm-eval's HF model does) and at an end-of-sequence token;
- `loglikelihood((context, continuation))`: (sum of log p(continuation token | prefix), whether
  every continuation token is the argmax), from one forward pass (`models.hidden_states` +
  `models.lm_head` at the continuation's positions only); the context / continuation split of the
  text follows lm-eval's HF model (trailing spaces of the context move to the continuation);
- `loglikelihood_rolling((text,))`: the text's total log-likelihood in windows of `max_length`
  tokens (lm-eval's `get_rolling_token_windows`), each scored like a continuation.

`apply_chat_template` renders lm-eval's chat turns with the tokenizer's template
(`--apply_chat_template`). The adapter is the `{target: adapter}` LoRA hook of `models.forward`
(e.g. a run's `adapter/` folder read by `lora.import_peft`); a full-parameter checkpoint enters as
`params`. The instance is handed to `lm_eval.simple_evaluate(model=...)` (it is not in lm-eval's
registry: lm-eval's own command line could not build it from a string); the command that
evaluates a finished run is `python -m essa_jax.evaluate_lm` (docs/IFEVAL.md).

This module imports lm-eval; nothing else in the library does at import time.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from lm_eval.api.model import LM
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from essa_jax.models import (
    ModelConfig,
    decode_completions,
    generate_jit,
    hidden_states,
    lm_head,
    pad_left,
)

LENGTH_BUCKET = (
    32  # prompts are padded to a multiple of this: one compile per bucket, not per length
)


def _bucket(n: int, size: int = LENGTH_BUCKET) -> int:
    return max(size, -(-n // size) * size)


@functools.partial(jax.jit, static_argnames=("config", "k"))
def continuation_scores(
    params: Any,
    config: ModelConfig,
    tokens: jax.Array,
    mask: jax.Array,
    lora: Mapping[str, Any] | None,
    k: int,
) -> tuple[jax.Array, jax.Array]:
    """Log-probs and greedy flags `[B, k]` of the last k tokens of left-padded `tokens [B, T]`.

    log p(x_t | x_<t) = log_softmax(lm_head(h_{t-1}))[x_t]; greedy = (argmax == x_t). Only the k
    positions' logits are formed ([B, k, V], not [B, T, V]).
    """
    h = hidden_states(params, config, tokens[:, :-1], attention_mask=mask[:, :-1], lora=lora)
    logits = lm_head(params, config, h[:, -k:])
    targets = tokens[:, -k:]
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), targets[..., None], -1)
    return logp[..., 0], jnp.argmax(logits, axis=-1) == targets


class EssaJaxLM(LM):
    """An essa_jax decoder (and optional LoRA) behind lm-eval's `LM` interface (module docstring).

    Args:
      model_config, params: the base model (`models.load_pretrained`, or a full-parameter
        checkpoint's weights).
      tokenizer: HF-style (`encode`, `decode`, `apply_chat_template`, `eos_token_id`).
      lora: `{target: adapter}` hook, or None for the base model.
      batch_size: rows per generation / scoring call.
      max_length: context window in tokens (default: the model's max_position_embeddings).
      max_gen_toks: new tokens when a request does not say (`gen_kwargs["max_gen_toks"]`).
      seed: sampling key of `do_sample` requests (request i uses fold_in(key, i)).
      name: the tokenizer / model name lm-eval's cache and chat-template bookkeeping record.
    """

    def __init__(
        self,
        model_config: ModelConfig,
        params: Any,
        tokenizer: Any,
        *,
        lora: Mapping[str, Any] | None = None,
        batch_size: int = 8,
        max_length: int | None = None,
        max_gen_toks: int = 256,
        seed: int = 0,
        name: str = "essa_jax",
    ):
        super().__init__()
        self.config, self.params, self.tokenizer, self.lora = model_config, params, tokenizer, lora
        self.batch_size = int(batch_size)
        self.max_length = int(max_length or model_config.max_position_embeddings)
        self.max_gen_toks = int(max_gen_toks)
        self.key = jax.random.PRNGKey(seed)
        self.name = name
        eos = getattr(tokenizer, "eos_token_id", None)
        ids = tuple(model_config.eos_token_ids) + ((eos,) if eos is not None else ())
        self.eos_token_ids = tuple(dict.fromkeys(int(i) for i in ids))
        self.prefix_token_id = self.eos_token_ids[0]  # scores a continuation with no context
        self.pad_id = int(model_config.pad_token_id)

    # -- lm-eval bookkeeping -----------------------------------------------------------------

    @property
    def tokenizer_name(self) -> str:
        return self.name

    def apply_chat_template(
        self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        return self.tokenizer.apply_chat_template(
            chat_history, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    # -- scoring -----------------------------------------------------------------------------

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """lm-eval's HF split: trailing spaces of the context start the continuation; the
        continuation's tokens are those of context + continuation after the context's."""
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            continuation, context = context[-n_spaces:] + continuation, context[:-n_spaces]
        whole = self.encode(context + continuation)
        ctx = self.encode(context)
        return ctx, whole[len(ctx) :]

    def score_tokens(
        self, pairs: Sequence[tuple[list[int], list[int]]]
    ) -> list[tuple[float, bool]]:
        """(sum log p(continuation | context), all greedy) of token-id pairs, `batch_size` at once.

        A row longer than `max_length` keeps its last `max_length` tokens (the context's start is
        dropped); an empty context is the prefix token (end of sequence, as lm-eval's HF model).
        """
        out: list[tuple[float, bool]] = []
        for start in range(0, len(pairs), self.batch_size):
            chunk = list(pairs[start : start + self.batch_size])
            rows, conts = [], []
            for ctx, cont in chunk:
                if not cont:
                    raise ValueError(
                        "lm-eval asked for the log-likelihood of an empty continuation"
                    )
                ids = (list(ctx) or [self.prefix_token_id]) + list(cont)
                rows.append(ids[-(self.max_length + 1) :])
                conts.append(min(len(cont), len(rows[-1]) - 1))
            k = _bucket(max(conts), 8)
            width = _bucket(max(max(len(r) for r in rows), k + 1))
            rows += [rows[0]] * (self.batch_size - len(rows))  # fixed batch: one compile
            tokens, mask = pad_left(rows, self.pad_id, length=width)
            logp, greedy = continuation_scores(
                self.params, self.config, jnp.asarray(tokens), jnp.asarray(mask), self.lora, k
            )
            logp, greedy = np.asarray(logp), np.asarray(greedy)
            for i, n in enumerate(conts):
                out.append((float(logp[i, k - n :].sum()), bool(greedy[i, k - n :].all())))
        return out

    def loglikelihood(
        self, requests: list[Any], disable_tqdm: bool = False
    ) -> list[tuple[float, bool]]:
        pairs = [self._encode_pair(*r.args) for r in requests]
        results = self.score_tokens(pairs)
        for r, res in zip(requests, results, strict=True):
            self.cache_hook.add_partial("loglikelihood", r.args, res)
        return results

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        results = []
        for r in requests:
            (text,) = r.args
            windows = [
                make_disjoint_window(w)
                for w in get_rolling_token_windows(
                    token_list=self.encode(text),
                    prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length,
                    context_len=1,
                )
            ]
            total = sum(lp for lp, _ in self.score_tokens(windows))
            self.cache_hook.add_partial("loglikelihood_rolling", r.args, total)
            results.append(total)
        return results

    # -- generation --------------------------------------------------------------------------

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        results: list[str] = []
        for start in range(0, len(requests), self.batch_size):
            chunk = requests[start : start + self.batch_size]
            # A batch shares its sampling settings; requests of one lm-eval task always do.
            groups: dict[tuple, list[int]] = {}
            for i, r in enumerate(chunk):
                groups.setdefault(self._settings(r.args[1]), []).append(i)
            texts: list[str | None] = [None] * len(chunk)
            for (max_new, greedy, temperature), idx in groups.items():
                done = self._generate(
                    [chunk[i].args[0] for i in idx],
                    max_new,
                    greedy,
                    temperature,
                    [start + i for i in idx],
                )
                for i, text in zip(idx, done, strict=True):
                    texts[i] = _cut(text, _until(chunk[i].args[1]))
            for r, text in zip(chunk, texts, strict=True):
                self.cache_hook.add_partial("generate_until", r.args, text)
            results.extend(texts)
        return results

    def _settings(self, gen_kwargs: Mapping[str, Any]) -> tuple[int, bool, float]:
        max_new = int(gen_kwargs.get("max_gen_toks", self.max_gen_toks))
        temperature = float(gen_kwargs.get("temperature", 0.0) or 0.0)
        greedy = not gen_kwargs.get("do_sample", False) or temperature <= 0.0
        return max_new, greedy, 1.0 if greedy else temperature

    def _generate(
        self,
        contexts: list[str],
        max_new: int,
        greedy: bool,
        temperature: float,
        request_ids: list[int],
    ) -> list[str]:
        """Completions of `contexts`; a sampled row draws with fold_in(key, its request index)."""
        keep = max(1, self.max_length - max_new)  # the context's last tokens that fit
        rows = [self.encode(c)[-keep:] or [self.prefix_token_id] for c in contexts]
        n = len(rows)
        rows += [rows[0]] * (self.batch_size - n)
        tokens, mask = pad_left(rows, self.pad_id, length=_bucket(max(len(r) for r in rows)))
        ids = request_ids + [request_ids[0]] * (len(rows) - n)  # padding rows: copies of row 0
        keys = jax.vmap(lambda i: jax.random.fold_in(self.key, i))(jnp.asarray(ids))
        gen = generate_jit(
            self.params,
            self.config,
            jnp.asarray(tokens),
            jnp.asarray(mask),
            keys,
            max_new_tokens=max_new,
            temperature=temperature,
            greedy=greedy,
            lora=self.lora,
            eos_token_ids=self.eos_token_ids,
            pad_token_id=self.pad_id,
        )
        texts = decode_completions(self.tokenizer, gen.tokens, gen.lengths, self.eos_token_ids)
        return list(texts[:n])


def _until(gen_kwargs: Mapping[str, Any]) -> list[str]:
    until = gen_kwargs.get("until") or []
    return [until] if isinstance(until, str) else list(until)


def _cut(text: str, until: Sequence[str]) -> str:
    """`text` up to the first occurrence of any stop string (lm-eval's HF model's rule)."""
    for stop in until:
        if stop:
            text = text.split(stop)[0]
    return text
