"""The toy decoder the GRPO tests train: 2 layers, 16-token vocabulary, GQA 4 / 2 heads.

One definition for the RL unit tests, the data-parallel tests and the multi-process GRPO worker
(tests/ is on sys.path under pytest; the worker adds it itself).
"""

from essa_jax.models import ModelConfig

TOY_CONFIG = ModelConfig(
    vocab_size=16,
    hidden_size=32,
    intermediate_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    tie_embeddings=True,
    max_position_embeddings=64,
    bos_token_id=1,
    eos_token_ids=(2,),
    pad_token_id=0,
)
