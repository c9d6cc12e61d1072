"""char_match: the dense shaping reward of the tiny test runs (it grades every completion)."""

import pytest

from essa_jax.rewards import REWARDS, char_match_reward, get_reward, guard_reward


def test_exact_near_and_far():
    r = char_match_reward(["1 + 2 = "] * 6, ["79", " 79\n", "78", "7a", "", "7"], answer=["79"] * 6)
    assert r[0] == r[1] == 1.0  # surrounding whitespace is ignored
    assert r[2] == pytest.approx((1 + (1 - 1 / 94)) / 2)
    assert r[3] == pytest.approx((1 + (1 - (ord("a") - ord("9")) / 94)) / 2)
    assert r[4] == 0.0  # nothing written
    assert r[5] == 0.5  # a missing character scores 0
    assert 1.0 > r[2] > r[3] > r[5] > r[4]


def test_extra_characters_dilute_and_range():
    (long,) = char_match_reward(["p"], ["79  xyz"], answer=["79"])
    assert long == pytest.approx(2 / 7)  # the 5 characters past the answer's 2 score 0
    assert char_match_reward(["p"], ["~"], answer=[" 0"]) == [pytest.approx(1 - 78 / 94)]
    assert char_match_reward(["p"], ["\x00"], answer=["~"]) == [0.0]  # clipped at 0
    assert char_match_reward(["p"], [""], answer=[""]) == [0.0]
    assert char_match_reward(["p"], ["5"], answer=[5]) == [1.0]  # numeric answers compare as text


def test_registered_and_length_checked():
    assert REWARDS["char_match"] is char_match_reward is get_reward("char_match")
    with pytest.raises(ValueError, match="field 'answer'"):
        char_match_reward(["p", "q"], ["1", "2"], answer=["1"])
    assert guard_reward(char_match_reward)(["p"], ["12"], answer=["12"]) == [1.0]
