"""Export LoRA adapters to, and import them from, the PEFT on-disk format.

A PEFT adapter is a folder with `adapter_config.json` and `adapter_model.safetensors`. Tensor names
are PEFT's for a `*ForCausalLM` wrapped by `PeftModel` (the adapter name is stripped on save):

    base_model.model.model.layers.{i}.self_attn.{q,k,v,o}_proj.lora_A.weight   [r, in]
    base_model.model.model.layers.{i}.self_attn.{q,k,v,o}_proj.lora_B.weight   [out, r]
    base_model.model.model.layers.{i}.mlp.{gate,up,down}_proj.lora_{A,B}.weight

so an adapter trained here loads with `peft.PeftModel.from_pretrained` on the transformers model,
and in serving engines that read PEFT adapters.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np

from essa_jax.lora.adapter import LoRA
from essa_jax.lora.config import VALID_TARGETS, LoraConfig, target_shape
from essa_jax.models.loading import HF_MODULE_NAMES

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"

MODULE_NAMES = HF_MODULE_NAMES  # the model's HF module names are the PEFT target modules
_PROJ_TO_TARGET = {v.split(".")[1]: k for k, v in MODULE_NAMES.items()}
_KEY_RE = re.compile(
    r"^base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$"
)


def peft_tensor_name(layer: int, target: str, factor: str) -> str:
    """PEFT's safetensors key for `factor` ("A" or "B") of `target` in layer `layer`."""
    return f"base_model.model.model.layers.{layer}.{MODULE_NAMES[target]}.lora_{factor}.weight"


def export_peft(
    path: str | Path,
    lora: dict[str, LoRA],
    lora_config: LoraConfig,
    *,
    base_model_name_or_path: str | None = None,
    dtype: Any = np.float32,
) -> Path:
    """Write `lora` as a PEFT adapter folder at `path`; returns the folder.

    `lora_config` supplies r, lora_alpha and use_rslora; they must agree with the adapters' shapes
    and scale (checked), so that PEFT rebuilds the same scale alpha / r.
    """
    from safetensors.numpy import save_file

    if set(lora) != set(lora_config.targets):
        raise ValueError(
            f"adapters {sorted(lora)} do not match LoraConfig.targets {lora_config.targets}"
        )
    tensors: dict[str, np.ndarray] = {}
    for t in lora_config.targets:
        ad = lora[t]
        if ad.a.shape[1] != lora_config.rank:
            raise ValueError(
                f"adapter {t!r} has rank {ad.a.shape[1]} but LoraConfig.rank={lora_config.rank}"
            )
        if not np.isclose(ad.scale, lora_config.scale, rtol=1e-6):
            raise ValueError(
                f"adapter {t!r} has scale {ad.scale} but LoraConfig gives {lora_config.scale} "
                f"(alpha={lora_config.alpha}, rank={lora_config.rank}, "
                f"use_rslora={lora_config.use_rslora})"
            )
        a = np.asarray(ad.a, dtype=np.float32).astype(dtype)
        b = np.asarray(ad.b, dtype=np.float32).astype(dtype)
        for layer in range(a.shape[0]):
            tensors[peft_tensor_name(layer, t, "A")] = np.ascontiguousarray(a[layer])
            tensors[peft_tensor_name(layer, t, "B")] = np.ascontiguousarray(b[layer])
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "r": lora_config.rank,
        "lora_alpha": lora_config.alpha,
        "use_rslora": lora_config.use_rslora,
        "target_modules": sorted(MODULE_NAMES[t].split(".")[1] for t in lora_config.targets),
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "modules_to_save": None,
        "layers_to_transform": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "use_dora": False,
    }
    (out / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
    save_file(tensors, str(out / WEIGHTS_NAME), metadata={"format": "pt"})
    return out


def import_peft(
    path: str | Path, model_config: Any, dtype: Any = jnp.float32
) -> tuple[LoraConfig, dict[str, LoRA]]:
    """Read a PEFT LoRA adapter folder written by `export_peft` or by PEFT itself.

    Returns `(LoraConfig, {target: LoRA})`. Raises ValueError for what this library cannot represent
    or what does not fit `model_config`: non-LoRA or DoRA adapters, per-module rank/alpha patterns,
    unknown module names, missing layers or factors, shape mismatches.
    """
    from safetensors.flax import load_file  # reads bf16 too (numpy cannot)

    folder = Path(path)
    cfg_path, w_path = folder / CONFIG_NAME, folder / WEIGHTS_NAME
    for p in (cfg_path, w_path):
        if not p.is_file():
            raise FileNotFoundError(f"PEFT adapter file missing: {p}")
    cfg = json.loads(cfg_path.read_text())
    if cfg.get("peft_type", "LORA") != "LORA":
        raise ValueError(
            f"{cfg_path}: peft_type={cfg.get('peft_type')!r}, only 'LORA' is supported"
        )
    for field in ("use_dora", "fan_in_fan_out"):
        if cfg.get(field):
            raise ValueError(f"{cfg_path}: {field}=true is not supported")
    for field in ("rank_pattern", "alpha_pattern"):
        if cfg.get(field):
            raise ValueError(f"{cfg_path}: {field} is not supported (one rank and alpha for all)")
    rank = int(cfg["r"])
    tensors = {k: np.asarray(v, np.float32) for k, v in load_file(str(w_path)).items()}
    found: dict[str, dict[int, dict[str, np.ndarray]]] = {}
    for name, arr in tensors.items():
        m = _KEY_RE.match(name.replace(".default.", "."))
        if m is None:
            raise ValueError(
                f"{w_path}: unexpected tensor {name!r}; expected names like "
                f"{peft_tensor_name(0, 'q', 'A')!r}"
            )
        layer, proj, factor = int(m.group(1)), m.group(3), m.group(4)
        if proj not in _PROJ_TO_TARGET:
            raise ValueError(
                f"{w_path}: tensor {name!r} adapts unknown module {proj!r}; supported modules: "
                f"{sorted(_PROJ_TO_TARGET)}"
            )
        target = _PROJ_TO_TARGET[proj]
        found.setdefault(target, {}).setdefault(layer, {})[factor] = arr
    targets = tuple(t for t in VALID_TARGETS if t in found)
    lora_config = LoraConfig(
        rank=rank,
        alpha=float(cfg.get("lora_alpha", 8)),
        targets=targets,
        use_rslora=bool(cfg.get("use_rslora", False)),
    )
    lora_config.validate_for(model_config)
    num_layers = model_config.num_layers
    lora: dict[str, LoRA] = {}
    for t in targets:
        fan_in, fan_out = target_shape(model_config, t)
        a_layers, b_layers = [], []
        for layer in range(num_layers):
            for factor, shape, store in (
                ("A", (rank, fan_in), a_layers),
                ("B", (fan_out, rank), b_layers),
            ):
                arr = found[t].get(layer, {}).get(factor)
                if arr is None:
                    raise ValueError(
                        f"{w_path}: missing tensor {peft_tensor_name(layer, t, factor)!r} "
                        f"(the model has {num_layers} layers; every layer must be adapted)"
                    )
                if arr.shape != shape:
                    raise ValueError(
                        f"{w_path}: {peft_tensor_name(layer, t, factor)!r} has shape {arr.shape}, "
                        f"expected {shape} (r={rank}, in={fan_in}, out={fan_out})"
                    )
                store.append(arr.astype(np.float32))
        extra = sorted(set(found[t]) - set(range(num_layers)))
        if extra:
            raise ValueError(
                f"{w_path}: target {t!r} has tensors for layers {extra}, but the model has "
                f"{num_layers} layers"
            )
        lora[t] = LoRA(
            a=jnp.asarray(np.stack(a_layers), dtype),
            b=jnp.asarray(np.stack(b_layers), dtype),
            scale=lora_config.scale,
        )
    return lora_config, lora
