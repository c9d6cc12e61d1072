"""Tokenizers from local files only (an HF directory, or the metadata of a GGUF file), and the one
decoding of generated token ids into completion strings."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from essa_jax.models.hub import resolve_name
from essa_jax.models.loading import CheckpointError

# Files of which an HF directory holds at least one when it has a tokenizer (fast, sentencepiece,
# BPE vocab).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def load_tokenizer(path_or_name: str | Path) -> Any:
    """A transformers tokenizer (`encode`, `decode`, `apply_chat_template`) for a local model.

    HF directory: AutoTokenizer with local_files_only. `.gguf` file (or "smollm2-135m-instruct"):
    transformers builds the tokenizer from the GGUF metadata; the chat template is taken from
    `tokenizer.chat_template` there. Never runs remote code.
    """
    from transformers import AutoTokenizer

    path = resolve_name(path_or_name)
    if path.is_dir():
        present = [f for f in TOKENIZER_FILES if (path / f).is_file()]
        if not present:
            raise CheckpointError(
                f"{path}: no tokenizer files (one of {', '.join(TOKENIZER_FILES)}); copy the "
                "checkpoint's tokenizer files there or set --config.model.tokenizer=/path/to/them"
            )
        return AutoTokenizer.from_pretrained(
            str(path), local_files_only=True, trust_remote_code=False
        )
    if path.is_file() and path.suffix == ".gguf":
        cache = _gguf_cache_dir(path)
        if cache is not None and (cache / "tokenizer_config.json").is_file():
            try:
                return AutoTokenizer.from_pretrained(
                    str(cache), local_files_only=True, trust_remote_code=False
                )
            except (OSError, ValueError):
                pass  # a partial or stale cache: rebuild it from the GGUF below
        tok = AutoTokenizer.from_pretrained(
            str(path.parent), gguf_file=path.name, local_files_only=True, trust_remote_code=False
        )
        if not getattr(tok, "chat_template", None):
            import gguf

            field = gguf.GGUFReader(str(path)).fields.get("tokenizer.chat_template")
            if field is not None:
                tok.chat_template = field.contents()
        if cache is not None:
            _save_cache(tok, cache)
        return tok
    raise CheckpointError(
        f"no tokenizer at {path_or_name!r}: expected an HF directory, a .gguf file, or "
        "'smollm2-135m-instruct'"
    )


def _gguf_cache_dir(path: Path) -> Path | None:
    """Cache dir of the tokenizer converted from `path`, keyed by the GGUF's name, size and mtime.

    Converting GGUF metadata to a fast tokenizer takes ~30 s; loading the saved result takes < 1 s.
    `ESSA_JAX_CACHE` overrides the root (default ~/.cache/essa_jax); "0" or "" disables caching.
    """
    root = os.environ.get("ESSA_JAX_CACHE", os.path.join("~", ".cache", "essa_jax"))
    if root in ("", "0"):
        return None
    st = path.stat()
    key = f"{path.stem}-{st.st_size}-{int(st.st_mtime)}"
    return Path(root).expanduser() / "tokenizers" / key


def _save_cache(tok: Any, cache: Path) -> None:
    """Write the tokenizer to `cache` atomically (a temp dir renamed), so a reader never sees half
    of it; a failure to write (read-only home, a concurrent writer) only costs the next load."""
    import shutil
    import tempfile

    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=cache.parent, prefix=cache.name + ".tmp")
        tok.save_pretrained(tmp)
        try:
            os.rename(tmp, cache)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # another process cached it first
    except OSError:
        pass


def decode_completions(
    decode: Any | Callable[[list[int]], str],
    tokens: Any,
    lengths: Any,
    eos_token_ids: Sequence[int] = (),
) -> Any:
    """Generated ids `[..., N]` with `lengths [...]` -> completion strings, nested like `lengths`.

    A row's completion is `tokens[..., :length]` (the pad tail dropped) without its last token when
    that is one of `eos_token_ids` (a row that finished), decoded by `decode`: a tokenizer (its
    `.decode(ids, skip_special_tokens=True)`) or a callable `list[int] -> str`. Returns a list of
    strings for `[B, N]`, a list of lists for `[P, B, N]`, and so on (one string for `[N]`).
    """
    if hasattr(decode, "decode"):
        tokenizer = decode

        def decode(ids: list[int]) -> str:
            return tokenizer.decode(ids, skip_special_tokens=True)

    tokens, lengths = np.asarray(tokens), np.asarray(lengths)
    if tokens.ndim < 1 or tokens.shape[:-1] != lengths.shape:
        raise ValueError(
            f"decode_completions needs tokens [..., N] and lengths [...], got {tokens.shape} and "
            f"{lengths.shape}"
        )
    eos = frozenset(int(e) for e in eos_token_ids)
    flat = np.empty(lengths.size, dtype=object)
    rows = tokens.reshape(-1, tokens.shape[-1])
    for i, (row, n) in enumerate(zip(rows, lengths.reshape(-1), strict=True)):
        ids = row[: int(n)].tolist()
        if ids and ids[-1] in eos:
            ids.pop()
        flat[i] = decode(ids)
    return flat.reshape(lengths.shape).tolist() if lengths.ndim else flat[0]
