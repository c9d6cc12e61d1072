"""What a gradient method trains of an adapter: `(trainable, frozen, to_lora)` triples.

The RL trainer (`essa_jax.rl.GRPOTrainer`) optimises a pytree `trainable` and builds the model's
LoRA hook argument with `to_lora(trainable, frozen) -> {target: adapter}`; it knows nothing of the
parameterisation. Each function here returns one standard choice:

  * `lora_policy`: every LoRA factor (GRPO / F-GRPO on the adapter);
  * `svd_policy`: the singular values s_A, s_B of an SVD adapter, U and V frozen (SVD-GRPO);
  * `genome_policy`: ESSA's genome, offsets to the SFT singular values (`lora.svd`): the parameters
    CMA-ES searches, trained by gradient instead (the ESSA paper's SVD-GRPO baseline).

The `to_lora` functions are also available on their own (`plain_to_lora`, `svd_to_lora`,
`genome_to_lora(layout)`) for a caller that builds the trainer before it has the adapter.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from essa_jax.lora.adapter import ToLora, plain_to_lora
from essa_jax.lora.svd import GenomeLayout, SVDBasis, SVDLoRA, genome_to_svd_lora


def svd_to_lora(
    trainable: Mapping[str, Any], frozen_adapter: Mapping[str, SVDLoRA]
) -> dict[str, SVDLoRA]:
    """`to_lora` of `svd_policy`: the frozen SVDLoRA of each target with trainable s_a, s_b."""
    return {
        t: ad.replace(s_a=trainable[t]["s_a"], s_b=trainable[t]["s_b"])
        for t, ad in frozen_adapter.items()
    }


def genome_to_lora(layout: GenomeLayout) -> ToLora:
    """`to_lora` of `genome_policy`: `(genome [D], basis) -> {target: SVDLoRA}` for `layout`."""

    def to_lora(genome: jax.Array, basis: SVDBasis) -> dict[str, SVDLoRA]:
        # Pytree flattening (jit arguments) sorts dict keys; the layout fixes the genome order.
        basis = basis.replace(factors={t: basis.factors[t] for t in layout.targets})
        return genome_to_svd_lora(basis, layout, genome)

    return to_lora


def lora_policy(lora: Mapping[str, Any]) -> tuple[Any, Any, ToLora]:
    """Train every LoRA factor: (trainable = the LoRA dict, frozen adapter None, to_lora)."""
    return dict(lora), None, plain_to_lora


def svd_policy(svd_lora: Mapping[str, SVDLoRA]) -> tuple[Any, Any, ToLora]:
    """SVD-GRPO (the ESSA paper's baseline, arXiv 2507.04453, Sec. 4): train s_A, s_B only.

    trainable = {target: {"s_a": [L, r], "s_b": [L, r]}}; U_A, V_A, M, U_B stay frozen.
    AdamW's weight decay would pull the singular values towards 0 (shrinking the SFT adapter);
    use weight_decay=0 here, or `genome_policy`, whose parameters are offsets from the SFT values.
    """
    for t, ad in svd_lora.items():
        if not isinstance(ad, SVDLoRA) or ad.s_a.ndim != 2:
            raise ValueError(
                f"svd_policy needs one SVDLoRA per target with s_a [L, r]; target {t!r} is "
                f"{type(ad).__name__}" + (f" with s_a {ad.s_a.shape}" if hasattr(ad, "s_a") else "")
            )
    trainable = {t: {"s_a": ad.s_a, "s_b": ad.s_b} for t, ad in svd_lora.items()}
    return trainable, dict(svd_lora), svd_to_lora


def genome_policy(
    basis: SVDBasis, layout: GenomeLayout, genome: jax.Array
) -> tuple[Any, Any, ToLora]:
    """SVD-GRPO over ESSA's genome (offsets to the SFT singular values, `[D]`): the same
    parameters CMA-ES searches, trained by gradient instead. frozen = the SVD basis."""
    return jnp.asarray(genome), basis, genome_to_lora(layout)
