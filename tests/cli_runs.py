"""What the subprocess tests of the CLI share: a tiny run's flags and a clean environment."""

from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MULTI_PROCESS_VARS = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")

# A tiny SFT-only run (random 2-layer model): data loading, SFT, held-out evaluation and reward
# scoring, adapter/ in seconds; no search loop.
TINY_SFT = [
    "--config.method=sft",
    "--config.model.path=random:tiny",
    "--config.task.num_train=16",
    "--config.task.num_heldout=4",
    "--config.task.max_prompt_tokens=64",
    "--config.lora.rank=2",
    "--config.lora.alpha=4.0",
    "--config.sft.steps=1",
    "--config.sft.batch_size=4",
    "--config.essa.alpha=1.0",
    "--config.essa.population_size=4",
    "--config.essa.prompts_per_candidate=4",
    "--config.essa.generations=1",
    "--config.eval.batch_size=16",
    "--config.eval.base_model=False",
    "--config.eval.pass_k_samples=0",
]


def cli_env(compile_cache: str | None = None) -> dict[str, str]:
    """This process's environment for a one-process, one-device CPU run of the repository's
    code: multi-process variables and XLA_FLAGS (virtual devices) dropped. `compile_cache`: a
    JAX persistent compilation cache folder that a test module's runs share (every compile kept),
    so each configuration compiles once per module."""
    env = {k: v for k, v in os.environ.items() if k not in (*MULTI_PROCESS_VARS, "XLA_FLAGS")}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    if compile_cache:
        env.update(
            JAX_COMPILATION_CACHE_DIR=compile_cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0"
        )
    return env
