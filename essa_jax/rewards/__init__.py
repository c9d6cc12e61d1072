"""Rewards for verifiable tasks: answer extraction, equivalence, reward functions (maximised).

extract_answer(text, mode="auto") -> str | None     final answer as written
answers_match(predicted, reference) -> bool          numeric fast path, then math-verify
math_reward(prompts, completions, answer=[...])      1.0 / 0.0, "auto" extraction
arith_reward(prompts, completions, answer=[...])     1.0 / 0.0, first number (prefill format)
format_reward(prompts, completions)                  1.0 when a non-empty \\boxed{} is present
char_match_reward(prompts, completions, answer=[...]) dense [0, 1] closeness of each character
ifeval_{inst,prompt}_{strict,loose}(prompts, completions, instruction_id_list=, kwargs=)
                                                     IFEval rewards (lm-eval's checkers)
combine_rewards([(fn, w), ...]) / guard_reward(fn)   failures and timeouts -> 0.0, counted
reward_guards(fn) / failure_limits(fn, limit)        every guard's counters; the failure limit
"""

from .extraction import EXTRACTION_MODES, extract_answer, find_boxed, parse_number
from .functions import (
    REWARDS,
    CombinedReward,
    GuardedReward,
    RewardFn,
    RewardFunctionError,
    arith_reward,
    char_match_reward,
    combine_rewards,
    failure_limits,
    format_reward,
    get_reward,
    guard_reward,
    make_math_reward,
    math_reward,
    over_failure_limit,
    register_reward,
    reward_guards,
)
from .ifeval import IFEVAL_REWARDS, follow_instructions, instruction_types
from .stats import RewardStats
from .timeout import RewardTimeoutError, abandoned_threads, call_with_timeout
from .verify import DEFAULT_VERIFY_TIMEOUT_S, VERIFY_STATS, answers_match

__all__ = [
    "DEFAULT_VERIFY_TIMEOUT_S",
    "EXTRACTION_MODES",
    "IFEVAL_REWARDS",
    "REWARDS",
    "VERIFY_STATS",
    "CombinedReward",
    "GuardedReward",
    "RewardFn",
    "RewardFunctionError",
    "RewardStats",
    "RewardTimeoutError",
    "abandoned_threads",
    "answers_match",
    "register_reward",
    "arith_reward",
    "call_with_timeout",
    "char_match_reward",
    "combine_rewards",
    "failure_limits",
    "extract_answer",
    "find_boxed",
    "follow_instructions",
    "format_reward",
    "get_reward",
    "guard_reward",
    "instruction_types",
    "make_math_reward",
    "math_reward",
    "over_failure_limit",
    "reward_guards",
    "parse_number",
]
