"""PEFT format: export -> peft + transformers gives our logits; PEFT's own files import here."""

import json

import jax
import numpy as np
import pytest
from lora_helpers import fwd, rand_tokens, random_lora

from essa_jax.lora import LoraConfig, export_peft, import_peft, peft_tensor_name
from essa_jax.models import load_pretrained

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

HF_CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        rms_norm_eps=1e-5,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        eos_token_id=2,
        pad_token_id=0,
        bos_token_id=1,
    ),
    "qwen2": lambda: transformers.Qwen2Config(
        vocab_size=89,
        hidden_size=24,
        intermediate_size=40,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        eos_token_id=3,
        pad_token_id=0,
        bos_token_id=1,
    ),
}


def _hf_model(name, path):
    torch.manual_seed(0)
    cls = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM}[name]
    model = cls(HF_CONFIGS[name]()).float().eval()
    model.save_pretrained(path)
    return model


def _hf_logits(model, tokens):
    with torch.no_grad():
        return model(torch.as_tensor(np.asarray(tokens), dtype=torch.long)).logits.numpy()


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_exported_adapter_loads_in_peft_with_same_logits(name, tmp_path):
    hf = _hf_model(name, tmp_path / "base")
    config, params = load_pretrained(str(tmp_path / "base"))
    lc = LoraConfig(rank=4, alpha=6.0, targets=("q", "k", "v", "o", "gate", "up", "down"))
    lora = random_lora(2, config, lc)
    export_peft(tmp_path / "adapter", lora, lc, base_model_name_or_path=str(tmp_path / "base"))

    peft_model = peft.PeftModel.from_pretrained(hf, str(tmp_path / "adapter")).eval()
    tokens = rand_tokens(3, (2, 7), config.vocab_size)
    ours = np.asarray(fwd(params, config, tokens, lora=lora))
    theirs = _hf_logits(peft_model, tokens)
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=1e-4)
    assert np.abs(ours - np.asarray(fwd(params, config, tokens))).max() > 1e-2

    # The other direction: an adapter written by PEFT itself imports here with the same logits.
    base = peft_model.unload() if hasattr(peft_model, "unload") else hf
    peft_cfg = peft.LoraConfig(
        r=2, lora_alpha=5, target_modules=["q_proj", "v_proj", "down_proj"], use_rslora=True
    )
    fresh = peft.get_peft_model(base, peft_cfg)
    with torch.no_grad():
        for n, p in fresh.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, 0.3)
    fresh.save_pretrained(str(tmp_path / "peft_written"))
    lc2, lora2 = import_peft(tmp_path / "peft_written", config)
    assert lc2 == LoraConfig(rank=2, alpha=5.0, targets=("q", "v", "down"), use_rslora=True)
    ours2 = np.asarray(fwd(params, config, tokens, lora=lora2))
    np.testing.assert_allclose(ours2, _hf_logits(fresh.eval(), tokens), atol=1e-4, rtol=1e-4)


def test_import_round_trip_and_errors(tmp_path):
    from lora_helpers import tiny_model
    from safetensors.numpy import load_file, save_file

    config, _ = tiny_model("llama")
    lc = LoraConfig(rank=3, alpha=7.0, targets=("q", "o", "up"), use_rslora=True)
    lora = random_lora(5, config, lc)
    path = export_peft(tmp_path / "a", lora, lc)
    cfg = json.loads((path / "adapter_config.json").read_text())
    assert cfg["r"] == 3 and cfg["lora_alpha"] == 7.0 and cfg["use_rslora"] is True
    assert sorted(cfg["target_modules"]) == ["o_proj", "q_proj", "up_proj"]
    tensors = load_file(str(path / "adapter_model.safetensors"))
    assert tensors[peft_tensor_name(1, "up", "A")].shape == (3, 32)
    assert tensors["base_model.model.model.layers.0.self_attn.o_proj.lora_B.weight"].shape == (
        32,
        3,
    )
    lc_back, back = import_peft(path, config)
    assert lc_back == lc
    for t in lc.targets:
        np.testing.assert_array_equal(back[t].a, lora[t].a)
        np.testing.assert_array_equal(back[t].b, lora[t].b)
        assert back[t].scale == lora[t].scale

    def write(name, mutate):
        bad = dict(tensors)
        mutate(bad)
        d = tmp_path / name
        d.mkdir()
        (d / "adapter_config.json").write_text(json.dumps(cfg))
        save_file(bad, str(d / "adapter_model.safetensors"))
        return d

    key = peft_tensor_name(0, "q", "A")
    unknown = write("unknown", lambda t: t.update({key.replace("q_proj", "qkv_proj"): t[key]}))
    with pytest.raises(ValueError, match="unknown module 'qkv_proj'"):
        import_peft(unknown, config)
    missing = write("missing", lambda t: t.pop(peft_tensor_name(1, "o", "B")))
    with pytest.raises(ValueError, match=r"missing tensor .*layers\.1\.self_attn\.o_proj\.lora_B"):
        import_peft(missing, config)
    shape = write("shape", lambda t: t.update({key: np.zeros((3, 31), np.float32)}))
    with pytest.raises(ValueError, match=r"has shape \(3, 31\), expected \(3, 32\)"):
        import_peft(shape, config)
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        import_peft(tmp_path / "nowhere", config)
    with pytest.raises(ValueError, match="LoraConfig gives"):
        export_peft(tmp_path / "b", lora, LoraConfig(rank=3, alpha=7.0, targets=lc.targets))


@pytest.mark.slow
def test_smollm2_adapter_in_peft_matches(tmp_path, smollm2_gguf_path):
    """SmolLM2-135M from the GGUF: our LoRA forward == transformers + peft on the same file."""
    config, params = load_pretrained(str(smollm2_gguf_path))
    lc = LoraConfig(rank=4, alpha=8.0, targets=("q", "k", "v", "o"))
    lora = random_lora(9, config, lc, std=0.05)
    export_peft(tmp_path / "adapter", lora, lc)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(smollm2_gguf_path.parent), gguf_file=smollm2_gguf_path.name, torch_dtype=torch.float32
    ).eval()
    peft_model = peft.PeftModel.from_pretrained(hf, str(tmp_path / "adapter")).eval()
    tokens = rand_tokens(4, (1, 12), config.vocab_size)
    ours = np.asarray(jax.jit(fwd, static_argnames="config")(params, config, tokens, lora=lora))
    np.testing.assert_allclose(ours, _hf_logits(peft_model, tokens), atol=2e-3, rtol=1e-3)
