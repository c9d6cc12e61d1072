"""`models.export.save_hf_dir`: trained weights written as a sharded Hugging Face checkpoint that
transformers loads with our logits, with the source's config.json or one built from the
ModelConfig (`hf_config_dict`), and that `load_pretrained` reads back exactly."""

import json

import jax
import numpy as np
import pytest

from essa_jax.models import load_pretrained
from essa_jax.models.export import hf_config_dict, save_hf_dir

torch = pytest.importorskip("torch")


@pytest.mark.parametrize(
    "arch,tied,own_config",
    [("llama", False, True), ("qwen2", True, False)],
    ids=["llama_source_config", "qwen2_built_config"],
)
def test_exported_checkpoint_loads_in_transformers_with_our_logits(
    tmp_path, save_hf, fwd, ref_logits, arch, tied, own_config
):
    import transformers as tf

    save_hf(tmp_path / "src", arch, tied=tied)
    config, params = load_pretrained(tmp_path / "src")
    # "Trained" weights: every leaf moved, so an export of the source weights would fail.
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(0), len(leaves))
    moved = jax.tree.unflatten(
        tree, [x + 0.05 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
    )
    out = tmp_path / "out"
    sources = (tmp_path / "src",) if own_config else ()
    files = save_hf_dir(out, moved, config, *sources, max_shard_bytes=64 * 1024)
    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(shards) > 1 and set(shards) <= {p.name for p in files}  # sharded, with an index
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(shards)
    if not own_config:
        assert json.loads((out / "config.json").read_text()) == hf_config_dict(config, "float32")

    tokens = np.random.default_rng(0).integers(0, config.vocab_size, (2, 12))
    model = tf.AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    ours = np.asarray(fwd(moved, config, tokens, attention_mask=np.ones((2, 12), np.int32)))
    before = np.asarray(fwd(params, config, tokens, attention_mask=np.ones((2, 12), np.int32)))
    assert np.abs(ours - before).max() > 1e-2  # the logits moved with the weights
    np.testing.assert_allclose(ref_logits(model, tokens), ours, atol=1e-4, rtol=0)

    config2, back = load_pretrained(out)
    assert config2 == config
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(moved), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
