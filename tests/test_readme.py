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
