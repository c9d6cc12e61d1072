"""Seed-based distribution: identical populations everywhere, shard evaluation, gathered fitness."""

import functools
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from es_problems import sphere

from essa_jax.es import CMAES
from essa_jax.es.distributed import (
    distributed_generation,
    evaluate_across_devices,
    pad_population,
    shard_bounds,
)
from essa_jax.population import make_population_mesh

WORKER = Path(__file__).with_name("es_mp_worker.py")


def test_shard_bounds_cover_the_padded_population():
    for p, n in [(10, 2), (10, 4), (7, 8), (96, 8)]:
        bounds = [shard_bounds(p, n, i) for i in range(n)]
        assert bounds[0][0] == 0 and all(
            a[1] == b[0] for a, b in zip(bounds[:-1], bounds[1:], strict=True)
        )
        assert bounds[-1][1] >= p and bounds[-1][1] - p < n
        assert pad_population(jnp.zeros((p, 3)), n).shape == (bounds[-1][1], 3)
    with pytest.raises(ValueError, match="shard_index"):
        shard_bounds(10, 2, 2)


@pytest.mark.parametrize("num_devices", [8, 3])
def test_evaluate_across_devices_matches_direct_evaluation(num_devices):
    devices = np.asarray(jax.local_devices()[:num_devices])
    mesh = jax.sharding.Mesh(devices, ("population",), axis_types=(jax.sharding.AxisType.Auto,))
    pop = jax.random.normal(jax.random.key(0), (10, 4))  # 10 is not a multiple of 8 or 3: padded
    fit = evaluate_across_devices(lambda x: -sphere(x), pop, mesh, axis_name="population")
    np.testing.assert_allclose(fit, -sphere(pop), rtol=1e-6)
    with pytest.raises(ValueError, match="not a mesh axis"):
        evaluate_across_devices(lambda x: -sphere(x), pop, mesh)


def test_evaluate_across_devices_on_the_population_mesh():
    """The default axis is the population engine's "pop": its (pop, data) mesh works as it is."""
    mesh = make_population_mesh(4, 2)
    pop = jax.random.normal(jax.random.key(1), (6, 3))
    fit = evaluate_across_devices(lambda x: -sphere(x), pop, mesh)
    np.testing.assert_allclose(fit, -sphere(pop), rtol=1e-6)


def test_distributed_generation_single_process_equals_plain_ask_tell():
    s = CMAES(4, population_size=6)
    state = s.init(jax.random.key(0), jnp.ones(4))
    key = jax.random.key(1)
    new, fit = distributed_generation(s, key, state, lambda x: -np.sum(np.asarray(x) ** 2, -1))
    pop = s.ask(key, state)
    ref = s.tell(state, pop, -sphere(pop))
    np.testing.assert_allclose(fit, -sphere(pop), rtol=1e-6)
    np.testing.assert_allclose(new.mean, ref.mean, rtol=1e-6)
    devices_gen = functools.partial(evaluate_across_devices, mesh=None)
    new2, _ = distributed_generation(s, key, state, lambda x: -sphere(x), evaluate=devices_gen)
    np.testing.assert_allclose(new2.mean, ref.mean, rtol=1e-6)


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow  # two fresh jax processes: ~20-60 s of start-up and compiles on a busy machine
@pytest.mark.multiprocess
def test_two_processes_end_with_the_single_process_state(tmp_path):
    sys.path.insert(0, str(WORKER.parent))
    import es_mp_worker

    generations, port = 6, _free_port()
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}  # one CPU device per process
    env["PYTHONPATH"] = os.pathsep.join([str(Path.cwd()), env.get("PYTHONPATH", "")])
    outs = [tmp_path / f"p{i}.npz" for i in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(port), str(i), str(generations), str(outs[i])],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for i in range(2)
    ]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=180)[0].decode(errors="replace"))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, log in zip(procs, logs, strict=True):
        assert p.returncode == 0, log[-3000:]

    results = [np.load(o) for o in outs]
    half = es_mp_worker.POPULATION // 2
    for r in results:  # each process evaluated only its half of every generation
        np.testing.assert_array_equal(r["evaluated"], [half] * generations)
    evaluated: list[int] = []
    single = es_mp_worker.run(generations, evaluated)
    assert evaluated == [es_mp_worker.POPULATION] * generations
    for field in type(single).__dataclass_fields__:
        # both processes hold bit-identical states, equal to the single-process run
        np.testing.assert_array_equal(results[0][field], results[1][field], err_msg=field)
        ref = np.asarray(getattr(single, field))
        np.testing.assert_allclose(results[0][field], ref, rtol=1e-6, atol=1e-7, err_msg=field)
    assert int(results[0]["generation"]) == generations
    assert float(results[0]["best_fitness"]) > float(es_mp_worker.toy_fitness(np.zeros(6)))
