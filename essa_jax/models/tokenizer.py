"""Tokenizers from local files only: an HF directory, or the metadata of a GGUF file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from essa_jax.models.hub import resolve_name
from essa_jax.models.loading import CheckpointError


def load_tokenizer(path_or_name: str | Path) -> Any:
    """A transformers tokenizer (`encode`, `decode`, `apply_chat_template`) for a local model.

    HF directory: AutoTokenizer with local_files_only. `.gguf` file (or "smollm2-135m-instruct"):
    transformers builds the tokenizer from the GGUF metadata; the chat template is taken from
    `tokenizer.chat_template` there. Never runs remote code.
    """
    from transformers import AutoTokenizer

    path = resolve_name(path_or_name)
    if path.is_dir():
        return AutoTokenizer.from_pretrained(
            str(path), local_files_only=True, trust_remote_code=False
        )
    if path.is_file() and path.suffix == ".gguf":
        tok = AutoTokenizer.from_pretrained(
            str(path.parent), gguf_file=path.name, local_files_only=True, trust_remote_code=False
        )
        if not getattr(tok, "chat_template", None):
            import gguf

            field = gguf.GGUFReader(str(path)).fields.get("tokenizer.chat_template")
            if field is not None:
                tok.chat_template = field.contents()
        return tok
    raise CheckpointError(
        f"no tokenizer at {path_or_name!r}: expected an HF directory, a .gguf file, or "
        "'smollm2-135m-instruct'"
    )
