"""A search that never searched (issue #44, case 5): a strategy's points are checked where they
enter the loop (non-finite `ask` genomes, a non-finite `tell` mean / sigma), and a run whose
candidates tie for `essa.max_flat_generations` generations in a row stops; each ends in one line
naming the strategy, exit status 2, the run's checkpoints as they were."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from essa_jax.config import ConfigError
from essa_jax.es import SearchError, get_strategy
from essa_jax.population import essa_generation
from essa_jax.population.evaluator import PopulationEval
from tests.cli_runs import ROOT, TINY_SFT, cli_env


@flax.struct.dataclass
class _State:
    mean: jax.Array
    sigma: jax.Array


@dataclasses.dataclass(frozen=True)
class _Broken:
    """A strategy whose ask (bad="ask") or tell (bad="tell") goes non-finite."""

    num_dims: int
    population_size: int
    bad: str = "ask"

    def init(self, key, mean):
        return _State(mean=mean, sigma=jnp.float32(0.1))

    def ask(self, key, state):
        z = state.mean + state.sigma * jax.random.normal(key, (self.population_size, self.num_dims))
        return z.at[1, 0].set(jnp.nan) if self.bad == "ask" else z

    def tell(self, state, population, fitness):
        return _State(mean=population.mean(0), sigma=state.sigma / (fitness.std() * 0.0))


def _evaluate(values):
    def evaluate(z, key):
        p = z.shape[0]
        fit = np.asarray(values(p), np.float32)
        return PopulationEval(
            fit, fit[:, None], np.ones((p, 1), np.int32), np.ones((p, 1), bool), {"tokens": p}
        )

    return evaluate


def test_non_finite_genomes_from_ask_stop_before_any_rollout():
    s = _Broken(num_dims=3, population_size=4, bad="ask")
    calls = []

    def values(p):
        calls.append(p)
        return np.arange(p)

    with pytest.raises(SearchError, match=r"strategy 'mine': ask returned 1 of 4 candidates"):
        essa_generation(
            s, s.init(None, jnp.zeros(3)), jax.random.PRNGKey(0), _evaluate(values), name="mine"
        )
    assert calls == []  # nothing was generated from a NaN genome


def test_a_non_finite_tell_names_the_field_and_a_finite_one_passes():
    s = _Broken(num_dims=3, population_size=4, bad="tell")
    with pytest.raises(SearchError, match=r"_Broken: tell returned a non-finite sigma"):
        essa_generation(s, s.init(None, jnp.zeros(3)), jax.random.PRNGKey(0), _evaluate(np.arange))
    # The same generation with a well-behaved built-in strategy moves its mean.
    cma = get_strategy("cma_es", num_dims=3, population_size=4, sigma_init=0.1)
    state = cma.init(jax.random.PRNGKey(1), jnp.zeros(3))
    new, ev = essa_generation(cma, state, jax.random.PRNGKey(0), _evaluate(np.arange))
    assert ev.metrics["skipped_tell"] == 0.0
    assert float(jnp.linalg.norm(new.mean - state.mean)) > 0


def test_max_flat_generations_is_checked_with_the_config():
    from essa_jax.config import base_config
    from essa_jax.train.essa import check_essa_section

    c = base_config()
    for bad in (-1, True):  # a float is refused by the ConfigDict itself
        c.essa.max_flat_generations = bad
        with pytest.raises(ConfigError, match="essa.max_flat_generations"):
            check_essa_section(c)


USER_STRATEGY = """
import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from essa_jax.config import base_config
from essa_jax.es import register_strategy


@flax.struct.dataclass
class S:
    mean: jax.Array
    sigma: jax.Array


@dataclasses.dataclass(frozen=True)
class NanES:
    num_dims: int
    population_size: int
    sigma_init: float = 0.1

    def init(self, key, mean):
        return S(mean=mean, sigma=jnp.float32(self.sigma_init))

    def ask(self, key, state):
        return jnp.full((self.population_size, self.num_dims), jnp.nan)

    def tell(self, state, population, fitness):
        return state


register_strategy("nan_es", NanES)


def get_config():
    c = base_config()
    c.essa.strategy = "nan_es"
    return c
"""


def _main(workdir, *args, config=None):
    cmd = [sys.executable, "-m", "essa_jax.main", f"--workdir={workdir}"]
    cmd += [f"--config={config or os.path.join(ROOT, 'essa_jax/config.py')}"]
    flags = [f for f in TINY_SFT if not f.startswith("--config.method")]
    return subprocess.run(
        [*cmd, *flags, "--config.method=essa", "--config.checkpoint.every=1", *args],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=str(workdir.parent),
        timeout=600,
    )


def _error_lines(proc):
    return [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]


@pytest.mark.slow  # two tiny CLI runs (~20 s of CPU each)
def test_cli_a_user_strategy_of_nan_and_a_search_of_ties_stop_in_one_line(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "nan_config.py").write_text(textwrap.dedent(USER_STRATEGY))
    work = tmp_path / "nan"
    proc = _main(work, config=folder / "nan_config.py")
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = _error_lines(proc)
    assert "strategy 'nan_es': ask returned 4 of 4 candidates with non-finite" in line
    assert "Traceback" not in proc.stderr
    assert os.path.isdir(work / "checkpoints" / "0")  # the SFT start stays resumable
    assert not (work / "summary.json").exists() and not (work / "adapter").exists()

    # Ties: a user's reward that scores every completion 0 gives a flat population each
    # generation.
    work = tmp_path / "flat"
    proc = _main(
        work,
        "--config.essa.generations=10",
        "--config.essa.max_flat_generations=3",
        "--config.task.reward=constant_zero_for_test",
        config=_constant_reward_config(folder),
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = _error_lines(proc)
    assert "the search is not searching: the candidates of strategy 'cma_es' tied" in line
    assert "in 3 generations in a row up to generation 3" in line
    assert "essa.max_flat_generations = 0" in line
    steps = sorted(int(n) for n in os.listdir(work / "checkpoints") if n.isdigit())
    assert steps[-1] == 2  # the last generation finished before the third tie is kept
    # Resumed with the stop turned off, the same run goes on to its end.
    proc = _main(
        work,
        "--config.essa.generations=4",
        "--config.essa.max_flat_generations=0",
        "--config.task.reward=constant_zero_for_test",
        config=_constant_reward_config(folder),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (work / "summary.json").exists()


def _constant_reward_config(folder):
    path = folder / "flat_config.py"
    path.write_text(
        textwrap.dedent(
            """
            from essa_jax.config import base_config
            from essa_jax.rewards import register_reward


            def zero(prompts, completions, **fields):
                return [0.0] * len(completions)


            register_reward("constant_zero_for_test", zero)


            def get_config():
                return base_config()
            """
        )
    )
    return path
