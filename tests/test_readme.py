"""The README's Python examples run as written (a README example that rots is worse than none)."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
# "# file: NAME.py" blocks are a user's files (a module and the config importing it): they run
# through the command line in tests/test_extending.py, not here.
ALL_BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
BLOCKS = [b for b in ALL_BLOCKS if not b.startswith("# file: ")]


def test_readme_has_examples():
    assert len(ALL_BLOCKS) >= 6 and len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index):
    from essa_jax.es import STRATEGIES
    from essa_jax.rewards import REWARDS

    # Examples register names; keep the registries as other tests expect them.
    saved = dict(STRATEGIES), dict(REWARDS)
    try:
        exec(
            compile(BLOCKS[index], f"README.md:python-block-{index}", "exec"),
            {"__name__": "readme"},
        )
    finally:
        STRATEGIES.clear(), STRATEGIES.update(saved[0])
        REWARDS.clear(), REWARDS.update(saved[1])


def _section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def test_readme_leads_with_a_newcomers_path():
    """What it is, the two commands, the configs, the library quick start, extending; then the
    results summary (the measurement record lives in docs/RESULTS.md)."""
    headings = re.findall(r"^## (.+)$", README.read_text(), flags=re.M)
    order = ["Two commands", "The configs", "Library quick start", "Extending", "Results"]
    assert [h for h in headings if h in order] == order, headings
    assert "```python" in _section("Library quick start")
    assert "Genome units" in _section("Library quick start")
    configs = sorted((README.parent / "experiments" / "configs").glob("*.py"))
    assert configs and all(
        f"experiments/configs/{c.name}" in _section("The configs") for c in configs
    )


def test_results_summary_traces_every_row_to_a_file_and_a_date():
    results = README.parent / "docs" / "RESULTS.md"
    record = results.read_text()
    rows = [r for r in _section("Results").splitlines() if r.startswith("| ") and "---" not in r]
    rows = rows[1:]  # the header
    assert len(rows) >= 10
    for row in rows:
        files = re.findall(r"`([\w.]+\.json)`", row)
        assert files, row
        for name in files:
            assert (README.parent / "experiments" / "results" / name).exists(), name
            assert name in record, name  # the record says how it was measured
        assert re.search(r"\| 2026-\d\d-\d\d[^|]*\|$", row), row  # the date it was measured
    assert "(docs/RESULTS.md)" in _section("Results")
