"""Strategies: wall time of one ask + tell generation, ours (jitted) vs pycma vs evosax.

Cells: D in {448, 7168} (ESSA genome sizes) x P in {24, 96}, fitness = -||x||^2 (cheap on purpose:
this measures the strategy, not the model). Columns, all in ms per generation:

- ours_cma: full CMA-ES, amortised = (ask + tell without refresh) + eigh(D) / eigen_interval.
- ours_sep: sep-CMA-ES (diagonal, no eigendecomposition), measured directly.
- pycma: cma.CMAEvolutionStrategy ask / tell (positive weights, CSA), amortised the same way with
  numpy's float64 eigh and pycma's own lazy gap 1 / ((c_1 + c_mu) D 10).
- evosax: evosax.algorithms.CMA_ES (0.3), which runs eigh inside every ask: (tell + sampling) +
  eigh(D) per generation. At D = 448 evosax's ask + tell is also timed directly as a check.

Full CMA-ES at D = 7168 holds a 7168^2 covariance (205 MB in f32) and needs an O(D^3) eigh: the eigh
time at D = 7168 is measured only when ESSA_BENCH_FULL_EIGH=1 (minutes per call on a small CPU);
otherwise it is extrapolated as t(1024) * (7168 / 1024)^3 and the JSON says so
(`eigh_source_d7168`). Generation costs without the eigh are always measured. Every time is the
minimum over repeats (after a warm-up call), which is the least load-sensitive estimate on a shared
machine.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import machine_info, print_table, time_fn, write_results
from essa_jax.es import CMAES, SepCMAES
from essa_jax.es.cma_es import _eigen_refresh

DIMS = (448, 7168)
POPS = (24, 96)
SIGMA = 0.5
EXTRAPOLATE_FROM = 1024


def _fitness(pop: jax.Array) -> jax.Array:
    return -jnp.sum(pop**2, axis=-1)


def _ms(t: dict[str, float]) -> float:
    # min, not median: on a shared CPU the median mostly measures the neighbours' load
    return 1e3 * t["min_s"]


def ours_generation_ms(strategy, d: int, repeats: int) -> float:
    """Jitted ask + fitness + tell, state donated (C is updated in place)."""

    def gen(state, key):
        pop = strategy.ask(key, state)
        return strategy.tell(state, pop, _fitness(pop))

    step = jax.jit(gen, donate_argnums=0)
    holder = [strategy.init(jax.random.key(0), jnp.zeros(d))]
    counter = [0]

    def run():
        counter[0] += 1
        holder[0] = step(holder[0], jax.random.key(counter[0]))
        return holder[0].mean

    out = _ms(time_fn(run, repeats=repeats, warmup=1))
    del holder[0]
    return out


def ours_ask_ms(strategy, d: int, repeats: int) -> float:
    state = strategy.init(jax.random.key(0), jnp.zeros(d))
    return _ms(time_fn(lambda: strategy.ask(jax.random.key(1), state), repeats=repeats))


def jax_eigh_ms(d: int) -> float:
    """Our refresh (symmetrise + eigh + floor) on a random SPD matrix, f32."""
    repeats = 5 if d <= EXTRAPOLATE_FROM else 1
    a = jax.random.normal(jax.random.key(0), (d, d)) / np.sqrt(d)
    s = CMAES(d).init(jax.random.key(0), jnp.zeros(d))
    s = s.replace(C=a @ a.T + jnp.eye(d))
    refresh = jax.jit(_eigen_refresh)
    return _ms(time_fn(lambda: refresh(s).D, repeats=repeats, warmup=1))


def numpy_eigh_ms(d: int) -> float:
    a = np.random.default_rng(0).standard_normal((d, d)) / np.sqrt(d)
    c = a @ a.T + np.eye(d)
    times = []
    for _ in range(5 if d <= EXTRAPOLATE_FROM else 1):
        t0 = time.perf_counter()
        np.linalg.eigh(c)
        times.append(time.perf_counter() - t0)
    return 1e3 * min(times)


def pycma_generation_ms(d: int, p: int, repeats: int) -> tuple[float, float]:
    """Fastest ask + tell without eigendecomposition (updatecovwait huge), and pycma's lazy gap."""
    import cma

    opts = {"popsize": p, "seed": 1, "CMA_active": False, "verbose": -9, "updatecovwait": 1e9,
            "AdaptSigma": cma.sigma_adaptation.CMAAdaptSigmaCSA}  # fmt: skip
    es = cma.CMAEvolutionStrategy(np.zeros(d), SIGMA, opts)
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        xs = es.ask()
        es.tell(xs, [float(np.sum(np.asarray(x) ** 2)) for x in xs])
        times.append(time.perf_counter() - t0)
    gap = 1.0 / (es.sp.c1 + es.sp.cmu) / d / 10
    del es
    return 1e3 * min(times[1:]), max(gap, 1.0)


def evosax_ms(d: int, p: int, repeats: int, direct: bool) -> tuple[float, float | None]:
    """evosax CMA_ES: (tell ms, direct ask + tell ms or None). evosax minimises: pass -fitness."""
    from evosax.algorithms import CMA_ES

    es = CMA_ES(population_size=p, solution=jnp.zeros(d))
    params = es.default_params.replace(std_init=jnp.asarray(SIGMA))
    key = jax.random.key(0)
    state = es.init(key, jnp.zeros(d), params)
    pop = jax.random.normal(key, (p, d)) * SIGMA
    fit = -_fitness(pop)
    tell = _ms(time_fn(lambda: es.tell(key, pop, fit, state, params)[0].mean, repeats=repeats))
    both = None
    if direct:

        def gen():
            population, st = es.ask(key, state, params)
            return es.tell(key, population, -_fitness(population), st, params)[0].mean

        both = _ms(time_fn(gen, repeats=repeats))
    return tell, both


def main() -> None:
    full_eigh = os.environ.get("ESSA_BENCH_FULL_EIGH", "0") == "1"
    info = machine_info()
    print(f"machine: {info['cpu']} x{info['cores']}, jax {info['jax']} ({info['backend']})")
    results: dict[str, float | str] = {}

    eigh_jax, eigh_np = {}, {}
    for d in DIMS:
        if d <= EXTRAPOLATE_FROM or full_eigh:
            eigh_jax[d], eigh_np[d] = jax_eigh_ms(d), numpy_eigh_ms(d)
            results[f"eigh_source_d{d}"] = "measured"
        else:
            if EXTRAPOLATE_FROM not in eigh_jax:
                eigh_jax[EXTRAPOLATE_FROM] = jax_eigh_ms(EXTRAPOLATE_FROM)
                eigh_np[EXTRAPOLATE_FROM] = numpy_eigh_ms(EXTRAPOLATE_FROM)
            scale = (d / EXTRAPOLATE_FROM) ** 3
            eigh_jax[d] = eigh_jax[EXTRAPOLATE_FROM] * scale
            eigh_np[d] = eigh_np[EXTRAPOLATE_FROM] * scale
            results[f"eigh_source_d{d}"] = f"extrapolated: t({EXTRAPOLATE_FROM}) * (d/1024)^3"
        results[f"jax_eigh_ms_d{d}"] = eigh_jax[d]
        results[f"numpy_eigh_ms_d{d}"] = eigh_np[d]
        print(
            f"eigh d={d}: jax f32 {eigh_jax[d]:.0f} ms, numpy f64 {eigh_np[d]:.0f} ms", flush=True
        )

    rows = []
    for d in DIMS:
        repeats = 3 if d < 4096 else 2
        for p in POPS:
            cell = f"d{d}_p{p}"
            full = CMAES(d, population_size=p, sigma_init=SIGMA)
            no_refresh = dataclasses.replace(full, eigen_interval=2**30)
            gen = ours_generation_ms(no_refresh, d, repeats)
            ours = gen + eigh_jax[d] / full.eigen_interval
            sep = ours_generation_ms(SepCMAES(d, population_size=p, sigma_init=SIGMA), d, repeats)
            gc.collect()
            py_gen, gap = pycma_generation_ms(d, p, repeats)
            pycma = py_gen + eigh_np[d] / gap
            gc.collect()
            ev_tell, ev_direct = evosax_ms(d, p, repeats, direct=d <= EXTRAPOLATE_FROM)
            evosax = ev_tell + ours_ask_ms(no_refresh, d, repeats) + eigh_jax[d]
            gc.collect()
            results.update({
                f"ours_ms_{cell}": ours, f"ours_gen_no_eigh_ms_{cell}": gen,
                f"ours_eigen_interval_{cell}": full.eigen_interval, f"ours_sep_ms_{cell}": sep,
                f"pycma_ms_{cell}": pycma, f"pycma_gen_no_eigh_ms_{cell}": py_gen,
                f"pycma_eigen_gap_{cell}": gap, f"evosax_ms_{cell}": evosax,
                f"evosax_tell_ms_{cell}": ev_tell,
            })  # fmt: skip
            if ev_direct is not None:
                results[f"evosax_direct_ms_{cell}"] = ev_direct
            row = {
                "D": d, "P": p, "ours_cma_ms": ours, "ours_no_eigh_ms": gen,
                "interval": full.eigen_interval, "ours_sep_ms": sep, "pycma_ms": pycma,
                "evosax_ms": evosax, "pycma/ours": pycma / ours, "evosax/ours": evosax / ours,
            }  # fmt: skip
            rows.append(row)
            print(row, flush=True)
    print_table(rows, "ask + tell per generation (ms, amortised eigh)")
    write_results("strategies", results)


if __name__ == "__main__":
    main()
