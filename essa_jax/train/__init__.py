"""The loops that join model, adapters, strategies, RL losses and tasks.

train_and_evaluate(config, workdir)   SFT -> ESSA / GRPO / F-GRPO / SVD-GRPO, with checkpoints,
                                      metrics (JSONL + TensorBoard), summary and plots
"""

from essa_jax.train.pipeline import build_run, load_summary, train_and_evaluate

__all__ = ["build_run", "load_summary", "train_and_evaluate"]
