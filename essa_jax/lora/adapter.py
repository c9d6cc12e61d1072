"""Plain LoRA adapters: parameters, PEFT's initialisation, the forward delta and merging into W.

Layout: PEFT's A and B with a leading layer axis, `a [L, r, in]`, `b [L, out, r]`; delta W = B A in
PyTorch's `[out, in]` layout, i.e. `(B A)^T` in our `[in, out]` kernel layout.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from essa_jax.lora.config import LoraConfig, target_shape
from essa_jax.models.quant import QuantizedKernel


@flax.struct.dataclass
class LoRA:
    """One LoRA adapter on one projection, stacked over layers (Hu et al. 2021, Eq. 3).

    Attributes:
      a: `[L, r, in]` PEFT's lora_A weights.
      b: `[L, out, r]` PEFT's lora_B weights.
      scale: alpha / r (static).

    The model scans the layer axis, so `delta` sees one layer's slice `a [r, in]`, `b [out, r]`.
    """

    a: jax.Array
    b: jax.Array
    scale: float = flax.struct.field(pytree_node=False, default=1.0)

    def delta(self, x: jax.Array) -> jax.Array:
        """scale * (x A^T) B^T for one layer: x `[..., in]` -> `[..., out]`."""
        h = jnp.einsum("...i,ri->...r", x, self.a.astype(x.dtype))
        return (self.scale * jnp.einsum("...r,or->...o", h, self.b.astype(x.dtype))).astype(x.dtype)

    def delta_kernel(self) -> jax.Array:
        """scale * (B A)^T as an `[L, in, out]` kernel update (our weight layout)."""
        return self.scale * jnp.einsum("lri,lor->lio", self.a, self.b)


# (trainable, frozen adapter) -> {target: adapter} (or None: no adapter): how a gradient method's
# trainable pytree becomes the model's LoRA hook argument (`lora.policies`, `rl.GRPOTrainer`).
ToLora = Callable[[Any, Any], Mapping[str, Any] | None]


def plain_to_lora(trainable: Any, frozen_adapter: Any) -> Mapping[str, Any]:
    """`to_lora` of `lora_policy` (and `rl.GRPOTrainer`'s default): the trainable pytree is the
    LoRA dict itself."""
    del frozen_adapter
    return trainable


def master_weights(tree: Any) -> Any:
    """`tree` with every floating leaf narrower than float32 (bfloat16, float16) cast to float32.

    Mixed precision (Micikevicius et al. 2018, Sec. 3.1): the trained parameters and the optimiser
    state stay float32 while the model runs in its own dtype. The adapters cast their factors to
    the activations' dtype at use (`LoRA.delta`, `SVDLoRA.delta`), so a float32 adapter on a
    bfloat16 model promotes nothing; their gradients arrive in float32. Kept in bfloat16, an
    AdamW step of lr 1e-6 on a weight of 0.1 (relative 1e-5, below bfloat16's 2^-8 spacing)
    rounds away. Other leaves are returned as they are (no copy).
    """

    def up(x: Any) -> Any:
        dt = getattr(x, "dtype", None)
        if dt is not None and jnp.issubdtype(dt, jnp.floating) and jnp.finfo(dt).bits < 32:
            return x.astype(jnp.float32)
        return x

    return jax.tree.map(up, tree)


def init_lora(
    key: jax.Array, model_config: Any, lora_config: LoraConfig, dtype: Any = jnp.float32
) -> dict[str, LoRA]:
    """Fresh adapters with PEFT's default initialisation.

    A ~ kaiming_uniform(a=sqrt(5)) as torch.nn.Linear, i.e. U(-1/sqrt(in), 1/sqrt(in)); B = 0, so
    the adapted model equals the base model at step 0 (PEFT `init_lora_weights=True`).

    Returns: `{target: LoRA(a [L, r, in], b [L, out, r])}` for every target of `lora_config`.
    """
    lora_config.validate_for(model_config)
    num_layers = model_config.num_layers
    out: dict[str, LoRA] = {}
    for i, t in enumerate(lora_config.targets):
        fan_in, fan_out = target_shape(model_config, t)
        # kaiming_uniform with a=sqrt(5): gain = sqrt(2 / (1 + 5)), bound = gain * sqrt(3 / fan_in).
        bound = 1.0 / math.sqrt(fan_in)
        a = jax.random.uniform(
            jax.random.fold_in(key, i),
            (num_layers, lora_config.rank, fan_in),
            dtype,
            minval=-bound,
            maxval=bound,
        )
        b = jnp.zeros((num_layers, fan_out, lora_config.rank), dtype)
        out[t] = LoRA(a=a, b=b, scale=lora_config.scale)
    return out


def check_lora_matches(params: dict, lora: dict[str, Any]) -> None:
    """Raise ValueError if an adapter's target or shapes do not fit `params` ([L, in, out])."""
    layers = params["layers"]
    for t, ad in lora.items():
        if t not in layers or "kernel" not in layers[t]:
            raise ValueError(
                f"LoRA target {t!r} is not a projection of these params; "
                f"available: {sorted(k for k in layers if isinstance(layers[k], dict))}"
            )
        num_layers, fan_in, fan_out = layers[t]["kernel"].shape
        if isinstance(ad, LoRA):
            expect_a = (num_layers, ad.a.shape[1], fan_in)
            expect_b = (num_layers, fan_out, ad.a.shape[1])
            if ad.a.shape != expect_a or ad.b.shape != expect_b:
                raise ValueError(
                    f"LoRA target {t!r}: a {ad.a.shape} / b {ad.b.shape} do not fit kernel "
                    f"{layers[t]['kernel'].shape}; expected a {expect_a}, b {expect_b}"
                )


def merge_lora(params: dict, lora: dict[str, LoRA]) -> dict:
    """Params with every adapter folded into its kernel: W <- W + scale * (B A)^T.

    Only the adapted kernels are new arrays; every other leaf is shared with `params`.
    """
    check_lora_matches(params, lora)
    layers = dict(params["layers"])
    for t, ad in lora.items():
        proj = dict(layers[t])
        kernel = proj["kernel"]
        if isinstance(kernel, QuantizedKernel):
            # Its integers and scales have no float values to add the delta to.
            raise ValueError(
                f"merge_lora: the {t!r} kernel is quantised ({type(kernel).__name__}); merge into "
                "the float weights (model.quantize = 'none') or keep the adapter separate"
            )
        proj["kernel"] = (kernel + ad.delta_kernel().astype(kernel.dtype)).astype(kernel.dtype)
        layers[t] = proj
    return {**params, "layers": layers}
