"""A broken newest checkpoint is never resumed from: the previous good one is, with a warning."""

import os

import jax.numpy as jnp
import numpy as np
import pytest

from essa_jax import checkpointing as ck
from essa_jax.checkpointing import CHECKPOINT_DIR, Checkpointer


def _state(step):
    return {"mean": jnp.full((5,), float(step)), "step": jnp.int32(step)}


@pytest.fixture
def three_steps(tmp_path):
    ckpt = Checkpointer(str(tmp_path), keep=5)
    for s in (1, 2, 3):
        ckpt.save(s, _state(s), {"wall_s": float(s)})
    yield ckpt, os.path.join(str(tmp_path), CHECKPOINT_DIR)
    ckpt.close()


def _truncate_all(path):
    for root, _, files in os.walk(path):
        for f in files:
            with open(os.path.join(root, f), "r+b") as fh:
                fh.truncate(0)


def test_truncated_latest_falls_back_with_warning(three_steps):
    ckpt, d = three_steps
    _truncate_all(os.path.join(d, "3", "state"))
    with pytest.raises(Exception):  # noqa: B017 - the point: the raw restore of step 3 fails
        ckpt.restore(3, _state(0))
    with pytest.warns(ck.CheckpointFallbackWarning, match="step 3"):
        step, state, meta = ck.restore_checkpointer_with_fallback(ckpt, d, _state(0))
    assert step == 2 and meta == {"wall_s": 2.0}
    np.testing.assert_array_equal(state["mean"], np.full((5,), 2.0))
    # Quarantined: no longer a step, kept for inspection.
    assert ck.complete_steps(d) == [1, 2]
    assert any(n.startswith("3.corrupt-") for n in os.listdir(d))


def test_tmp_dir_of_interrupted_write_is_not_a_step(three_steps):
    ckpt, d = three_steps
    # What a SIGKILL during orbax's write leaves behind: an unfinalised tmp directory.
    os.makedirs(os.path.join(d, "4.orbax-checkpoint-tmp-1700000000"))
    assert ck.complete_steps(d) == [1, 2, 3]
    step, state, _ = ck.restore_checkpointer_with_fallback(ckpt, d, _state(0))
    assert step == 3 and int(state["step"]) == 3


def test_deleted_step_files_and_no_valid_step(three_steps):
    ckpt, d = three_steps
    for s in (1, 2, 3):
        _truncate_all(os.path.join(d, str(s)))
    with pytest.warns(ck.CheckpointFallbackWarning):
        assert ck.restore_checkpointer_with_fallback(ckpt, d, _state(0), quarantine=False) is None
    assert ck.complete_steps(d) == [1, 2, 3]
    assert ck.complete_steps(os.path.join(d, "missing")) == []


def test_restore_latest_valid_order_and_broken_list():
    calls = []

    def restore(s):
        calls.append(s)
        if s > 5:
            raise ValueError(f"bad {s}")
        return s * 10

    with pytest.warns(ck.CheckpointFallbackWarning):
        out = ck.restore_latest_valid(restore, [3, 7, 5, 6])
    assert out == (5, 50, [7, 6]) and calls == [7, 6, 5]


def _big_state(step):
    # A distinctive, incompressible-looking payload large enough for its own chunk file.
    rng = np.random.default_rng(step)
    return {"w": jnp.asarray(rng.standard_normal(1 << 18, dtype=np.float32)), "step": step}


def test_damaged_array_bytes_are_detected_and_fall_back(tmp_path):
    """A byte flipped inside the stored array's data (files well-formed, sizes unchanged) is
    never restored: the damaged step fails (the per-array digest, when the reader itself cannot
    see it) and the previous one is resumed."""
    ckpt = Checkpointer(str(tmp_path), keep=5)
    for s in (1, 2):
        ckpt.save(s, _big_state(s), {"wall_s": float(s)})
    d = os.path.join(str(tmp_path), CHECKPOINT_DIR)
    files = [
        os.path.join(root, f) for root, _, fs in os.walk(os.path.join(d, "2", "state")) for f in fs
    ]
    biggest = max(files, key=os.path.getsize)  # the 1 MB array's data file
    assert os.path.getsize(biggest) > 100_000
    with open(biggest, "r+b") as fh:
        fh.seek(os.path.getsize(biggest) // 2)
        b = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([b[0] ^ 0x10]))
    with pytest.raises(Exception):  # noqa: B017 - the point: step 2 cannot be read back as is
        ckpt.restore(2, _big_state(0))
    # The reader decodes the damaged chunk without complaint; the digest is what sees it.
    with pytest.warns(ck.CheckpointFallbackWarning, match="step 2.*CheckpointDigestError"):
        step, state, meta = ck.restore_checkpointer_with_fallback(ckpt, d, _big_state(0))
    assert step == 1 and meta == {"wall_s": 1.0}
    np.testing.assert_array_equal(state["w"], _big_state(1)["w"])
    ckpt.close()


def test_digests_name_the_changed_leaf():
    a = {"m": jnp.arange(4.0), "k": jnp.zeros((2,), jnp.bfloat16), "n": 3}
    written = ck.array_digests(a)
    ck.check_digests(a, written, "x")  # the same state passes
    b = {**a, "k": a["k"].at[1].set(1.0)}
    with pytest.raises(ck.CheckpointDigestError, match=r"\['k'\] of x"):
        ck.check_digests(b, written, "x")
    with pytest.raises(ck.CheckpointDigestError, match="absent"):
        ck.check_digests({"m": a["m"]}, written, "x")


def test_saved_shapes_are_global_for_a_state_sharded_over_the_mesh(tmp_path):
    """The resume's shape check compares global shapes: orbax's own tree metadata records a
    device shard's shape for a sharded array, which refused every resume on a mesh."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from essa_jax.mesh import make_mesh

    mesh = make_mesh()
    n = mesh.devices.size
    assert n > 1  # the case that needs the global shape (tests run on 8 virtual devices)
    sharded = jax.device_put(jnp.ones((2, 4 * n)), NamedSharding(mesh, PartitionSpec(None, "pop")))
    assert sharded.addressable_shards[0].data.shape != sharded.shape  # really split
    state = {"w": sharded, "b": jnp.zeros(3), "none": None}
    c = Checkpointer(str(tmp_path))
    c.save(1, state, {"x": 1})
    saved = c.saved_shapes(1)
    assert saved == {"['w']": (2, 4 * n), "['b']": (3,)}
    assert ck.shape_differences(state, saved) == []
    changed = {"w": jnp.ones((2, 4 * n + 1)), "b": jnp.zeros(3)}
    assert ck.shape_differences(changed, saved) == [
        f"['w']: saved (2, {4 * n}), this config (2, {4 * n + 1})"
    ]
    _, meta = c.restore(1, state)
    assert meta == {"x": 1}  # the bookkeeping keys are not handed back
    c.close()
