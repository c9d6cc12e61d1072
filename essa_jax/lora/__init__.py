"""LoRA adapters, PEFT import/export, ESSA's SVD reparametrisation (genome <-> adapter), and the
trainable parameterisations of gradient methods (`policies`: lora / svd / genome policies)."""

from essa_jax.lora.adapter import LoRA, check_lora_matches, init_lora, merge_lora
from essa_jax.lora.config import (
    ATTENTION_TARGETS,
    MLP_TARGETS,
    VALID_TARGETS,
    LoraConfig,
    target_shape,
)
from essa_jax.lora.peft_io import MODULE_NAMES, export_peft, import_peft, peft_tensor_name
from essa_jax.lora.policies import (
    ToLora,
    genome_policy,
    genome_to_lora,
    lora_policy,
    plain_to_lora,
    svd_policy,
    svd_to_lora,
)
from essa_jax.lora.svd import (
    GenomeLayout,
    Segment,
    SVDBasis,
    SVDFactors,
    SVDLoRA,
    basis_shape,
    fuse_shared_input,
    genome_to_singular_values,
    genome_to_svd_lora,
    num_free_values,
    population_svd_lora,
    sft_genome,
    svd_factorize,
    svd_lora_to_lora,
)

__all__ = [
    "ATTENTION_TARGETS",
    "MLP_TARGETS",
    "MODULE_NAMES",
    "VALID_TARGETS",
    "GenomeLayout",
    "LoRA",
    "LoraConfig",
    "SVDBasis",
    "SVDFactors",
    "SVDLoRA",
    "Segment",
    "ToLora",
    "check_lora_matches",
    "export_peft",
    "fuse_shared_input",
    "genome_policy",
    "genome_to_lora",
    "genome_to_singular_values",
    "genome_to_svd_lora",
    "import_peft",
    "init_lora",
    "lora_policy",
    "merge_lora",
    "num_free_values",
    "peft_tensor_name",
    "plain_to_lora",
    "population_svd_lora",
    "sft_genome",
    "basis_shape",
    "svd_factorize",
    "svd_lora_to_lora",
    "svd_policy",
    "svd_to_lora",
    "target_shape",
]
