"""The README's Python examples run as written (a README example that rots is worse than none)."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_examples():
    assert len(BLOCKS) >= 3


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
