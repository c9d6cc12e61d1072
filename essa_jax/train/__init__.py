"""The loops that join model, adapters, strategies, RL losses and tasks.

train_and_evaluate(config, workdir)   SFT -> ESSA / GRPO / F-GRPO / SVD-GRPO, with checkpoints,
                                      metrics (JSONL + TensorBoard), summary and plots
validate_config(config)               every field, the method's section by its method object
register_method(method)               a user's method (`essa_jax.train.methods`)
"""

from essa_jax.train.methods import (
    Method,
    get_method,
    method_names,
    register_method,
    validate_config,
)
from essa_jax.train.pipeline import build_run, load_summary, train_and_evaluate

__all__ = [
    "Method",
    "build_run",
    "get_method",
    "load_summary",
    "method_names",
    "register_method",
    "train_and_evaluate",
    "validate_config",
]
