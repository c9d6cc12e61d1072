"""The documentation stays true without running anything heavy (issue #42).

- Every field a recorded run wrote to `metrics.jsonl` or `summary.json` (the runs archived under
  `experiments/results/*_runs/`, and `make_run.json`'s summary) is documented in docs/OUTPUTS.md,
  and every documented field is still written by the code (its name appears in `essa_jax/`).
- Every relative link of README.md and docs/**/*.md points at a file or folder that exists, and
  an `#anchor` at a heading of the page it names.
"""

import json
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTPUTS = ROOT / "docs" / "OUTPUTS.md"
RESULTS = ROOT / "experiments" / "results"


def _section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def documented(title: str) -> set[str]:
    """The field names of the tables under `## title` of docs/OUTPUTS.md: each table row's
    first cell, in backticks (`pass_at_<k>` stands for every k; `a.b`: key b of the object a)."""
    names = set()
    for line in _section(OUTPUTS.read_text(), title).splitlines():
        cells = line.split("|")
        if line.startswith("| `") and len(cells) > 2:
            names.update(re.findall(r"`([^`]+)`", cells[1]))
    return names


def _pattern(names: set[str]) -> re.Pattern:
    alts = [re.escape(n).replace(re.escape("<k>"), r"\d+") for n in sorted(names)]
    return re.compile("|".join(f"(?:{a})" for a in alts) + r"\Z")


def _keys(obj: dict, prefix: str = "") -> set[str]:
    """Top-level keys, and one level into objects (`parent.child`) whose keys are names, not
    data (every key an identifier)."""
    out = set()
    for k, v in obj.items():
        out.add(prefix + k)
        if not prefix and isinstance(v, dict) and all(re.fullmatch(r"[a-z_]\w*", c) for c in v):
            out |= _keys(v, f"{k}.")
    return out


@cache
def recorded() -> tuple[set[str], set[str]]:
    """(metrics keys, summary keys) of every recorded run in the repository."""
    metrics, summary = set(), set()
    for path in RESULTS.glob("*_runs/**/metrics.jsonl"):
        for line in path.read_text().splitlines():
            if line.strip():
                metrics |= _keys(json.loads(line))
    for path in RESULTS.glob("*_runs/**/summary.json"):
        summary |= _keys(json.loads(path.read_text()))
    make_run = RESULTS / "make_run.json"
    if make_run.exists():  # the default run's summary.json, as recorded
        summary |= _keys(json.loads(make_run.read_text())["summary"])
    return metrics, summary


def test_recorded_runs_exist():
    metrics, summary = recorded()
    assert {"phase", "step", "acc", "reward"} <= metrics, sorted(metrics)
    assert {"method", "final_heldout_acc"} <= summary, sorted(summary)


def test_every_recorded_field_is_documented():
    for title, keys in zip(("metrics.jsonl", "summary.json"), recorded(), strict=True):
        pattern = _pattern(documented(title))
        missing = sorted(k for k in keys if not pattern.match(k))
        assert not missing, f"{title} fields a run wrote, not in docs/OUTPUTS.md: {missing}"


def test_every_documented_field_is_written_by_the_code():
    """A field documented but no longer written (renamed, removed) is stale documentation: its
    name (a template's fixed part) must appear as a string or keyword in essa_jax/."""
    code = "\n".join(p.read_text() for p in (ROOT / "essa_jax").rglob("*.py"))
    for title in ("metrics.jsonl", "summary.json"):
        for name in documented(title):
            leaf = name.split(".")[-1].replace("<k>", "{k}")
            found = re.search(rf"[\"']{re.escape(leaf)}[\"']|\b{re.escape(leaf)}=", code)
            assert found, f"{title} field {name!r} of docs/OUTPUTS.md is not written in essa_jax/"


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_relative_links_resolve():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):  # http(s), mailto
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
