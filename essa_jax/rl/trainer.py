"""The GRPO-family training step: rollouts, rewards, (focal) advantages, optax updates.

One step (GRPO, arXiv 2402.03300, Alg. 1; F-GRPO, arXiv 2602.06717):
  1. rollouts: each prompt repeated `group_size` times (groups contiguous) and sampled with the
     current adapter (`essa_jax.models.generate`, temperature T);
  2. rewards from a host function `reward_fn(prompts, completions, **task_fields) -> list[float]`;
  3. advantages: `compute_advantages` = the estimator `cfg.advantage` (`essa_jax.rl.advantage`:
     "group" = GRPO) times the weighting `cfg.weighting` (`essa_jax.rl.weighting`: "focal" =
     F-GRPO's (1 - mu)^gamma per prompt group, applied to the advantages before the loss);
  4. old log-probs (the behaviour policy) and, when beta > 0, reference log-probs: the *base model
     with the adapter disabled* (lora=None), so no second copy of the weights exists;
  5. `epochs` passes of `num_minibatches` AdamW updates, each one jitted call of
     `update_step(policy, trainable, opt_state, batch)`.

What is trained is decided by the caller through two inputs, so GRPO on a LoRA and the ESSA paper's
SVD-GRPO baseline (gradients on the singular values only, U and V frozen) share all the code:
  * `trainable`: the pytree the optimiser updates (LoRA dict, singular values, or a genome);
  * `to_lora(trainable, frozen_adapter) -> {target: adapter}`: the model's LoRA hook argument.
`essa_jax.lora.policies` (`lora_policy`, `svd_policy`, `genome_policy`) builds the standard choices;
this module knows nothing of them (the default `to_lora` passes `trainable` through as the LoRA).

Old log-probs: by default they are recomputed with a teacher-forced pass (`sequence_logprobs`), the
same code path as the training log-probs, so at the first update the ratio is exactly 1. The
sampler's own log-probs (KV-cache decode) agree only to float rounding (~1e-6 in float32; more in
bf16), so they are used only with `use_generation_logprobs=True`. When the batch is used for exactly
one update (epochs = num_minibatches = 1) the policy that sampled is the one being differentiated,
so old_logp = stop_gradient(logp) and the extra forward pass is skipped (as TRL does).

State = `GRPOState(params, opt_state, step, key)`, a pytree: checkpoint it and a resumed run is
bit-identical. Rewards are maximised; the loss is minimised.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from essa_jax.lora.adapter import master_weights
from essa_jax.models.config import ModelConfig
from essa_jax.models.generate import Generation, generate, generate_chunked
from essa_jax.models.logprobs import sequence_logprobs
from essa_jax.models.tokenizer import decode_completions
from essa_jax.rl.advantage import get_estimator, zero_variance_fraction
from essa_jax.rl.config import GRPOConfig
from essa_jax.rl.losses import combine_micro_batch_aux, micro_batch_weights, policy_loss
from essa_jax.rl.weighting import get_weighting

ToLora = Callable[[Any, Any], Mapping[str, Any] | None]
RewardFn = Callable[..., Sequence[float]]


@flax.struct.dataclass
class GRPOState:
    """Everything that changes during training (a pytree; checkpoint / resume it as is).

    params: the trainable pytree; opt_state: the optax state; step: int32 scalar;
    key: raw PRNG key data (uint32 [2]), split once per step.
    """

    params: Any
    opt_state: Any
    step: jax.Array
    key: jax.Array


@flax.struct.dataclass
class FrozenPolicy:
    """What the optimiser does not touch: base weights and the frozen part of the adapter."""

    base: Any
    adapter: Any = None


@flax.struct.dataclass
class RolloutBatch:
    """One optimisation batch of B = prompts x group_size rollouts (Tp prompt, N new tokens).

    tokens [B, Tp + N] (left-padded prompt, then completion); attention_mask [B, Tp + N];
    completion_mask [B, N] float (1 = sampled token, EOS included); advantages [B];
    old_logp [B, N] or None (on-policy: the current log-probs, detached); ref_logp [B, N] or None.
    """

    tokens: jax.Array
    attention_mask: jax.Array
    completion_mask: jax.Array
    advantages: jax.Array
    old_logp: jax.Array | None = None
    ref_logp: jax.Array | None = None


def _plain_to_lora(trainable: Any, frozen_adapter: Any) -> Mapping[str, Any]:
    """The default `to_lora`: `trainable` is the LoRA dict itself."""
    del frozen_adapter
    return trainable


# ----------------------------------------------------------------------------- building blocks


def make_optimizer(cfg: GRPOConfig) -> optax.GradientTransformation:
    """AdamW with global-norm gradient clipping (F-GRPO paper: lr 1e-6, wd 0.01, clip 1.0)."""
    return optax.chain(
        optax.clip_by_global_norm(cfg.max_grad_norm),
        optax.adamw(
            cfg.learning_rate,
            b1=cfg.adam_b1,
            b2=cfg.adam_b2,
            eps=cfg.adam_eps,
            weight_decay=cfg.weight_decay,
        ),
    )


def compute_advantages(rewards: jax.Array, cfg: GRPOConfig) -> tuple[jax.Array, jax.Array]:
    """(weights * advantages, weights) per rollout, `[B]` each.

    advantages = `get_estimator(cfg.advantage)(rewards, cfg.group_size, cfg)` and weights =
    `get_weighting(cfg.weighting)(rewards, cfg.group_size, cfg)`, both looked up by name in their
    registries (`essa_jax.rl.advantage`, `essa_jax.rl.weighting`): registering a new estimator or
    weighting (e.g. a group filter) needs no change here. The weighting is F-GRPO's separate
    transform: it scales the advantages per prompt group before the loss (weights are 1 with
    weighting "none"), and is a constant for the optimiser.
    """
    adv = get_estimator(cfg.advantage)(rewards, cfg.group_size, cfg)
    weights = jax.lax.stop_gradient(get_weighting(cfg.weighting)(rewards, cfg.group_size, cfg))
    return weights * adv, weights


def _split_completion(lp: jax.Array, num_new: int) -> jax.Array:
    """Entries of sequence_logprobs [B, Tp+N-1] that score the N completion tokens."""
    return lp[:, lp.shape[1] - num_new :]


class GRPOTrainer:
    """Compiled GRPO-family step for one model config, `GRPOConfig` and parameterisation.

    Holds no training state (that is `GRPOState`); it holds the jitted functions, built once.

    Args:
      model_config: the model's `ModelConfig`.
      cfg: `GRPOConfig`.
      to_lora: `(trainable, frozen_adapter) -> {target: adapter}` (see `essa_jax.lora.policies`);
        default: `trainable` is the LoRA dict.
      reward_fn: host reward `fn(prompts, completions, **task_fields) -> list[float]`, maximised.
      decode: token ids -> text of a completion (EOS already stripped).
      optimizer: optax transformation; default `make_optimizer(cfg)`.
      eos_token_ids: end-of-sequence ids for generation (default: the model config's).
    """

    def __init__(
        self,
        model_config: ModelConfig,
        cfg: GRPOConfig,
        *,
        to_lora: ToLora = _plain_to_lora,
        reward_fn: RewardFn,
        decode: Callable[[list[int]], str],
        optimizer: optax.GradientTransformation | None = None,
        eos_token_ids: Sequence[int] | None = None,
    ):
        self.model_config = model_config
        self.cfg = cfg
        self.to_lora = to_lora
        self.reward_fn = reward_fn
        self.decode = decode
        self.optimizer = optimizer or make_optimizer(cfg)
        self.eos_token_ids = tuple(
            model_config.eos_token_ids if eos_token_ids is None else eos_token_ids
        )
        self.rollout = jax.jit(self._rollout)
        self.score = jax.jit(self._score, static_argnames=("with_policy", "with_ref"))
        # No buffer donation: a caller may keep the old state (e.g. to retry or compare a step).
        self.update_step = jax.jit(self._update_step)

    # -- state

    def init(self, trainable: Any, key: jax.Array) -> GRPOState:
        """Initial state; `key` may be a typed key or raw key data.

        The trainable and the optimiser state are float32 masters (`lora.master_weights`: bfloat16
        leaves are upcast) whatever the model dtype; the adapters cast to the activations' dtype
        at use. Abstract state for a planner: `jax.eval_shape(self.init, trainable, key)`.
        """
        if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
            key = jax.random.key_data(key)
        trainable = master_weights(trainable)
        return GRPOState(
            params=trainable,
            opt_state=self.optimizer.init(trainable),
            step=jnp.zeros((), jnp.int32),
            key=jnp.asarray(key),
        )

    # -- jitted pieces

    def _rollout(
        self,
        policy: FrozenPolicy,
        trainable: Any,
        prompt_tokens: jax.Array,
        prompt_mask: jax.Array,
        key: jax.Array,
    ) -> Generation:
        """group_size completions per prompt: rows [P * N], each prompt's group contiguous.

        cfg.rows_per_chunk > 0 generates them in chunks of that many rows (one chunk's KV cache
        live at a time), row r sampled with fold_in(key, r): the same rollouts for every chunk
        size. 0 = one batch sampled with the one key (`models.generate`; other samples).
        """
        cfg = self.cfg
        tokens = jnp.repeat(prompt_tokens, cfg.group_size, axis=0)
        mask = jnp.repeat(prompt_mask, cfg.group_size, axis=0)
        settings = dict(
            max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            top_k=cfg.top_k,
            top_p=cfg.top_p,
            lora=self.to_lora(trainable, policy.adapter),
            eos_token_ids=self.eos_token_ids,
        )
        if not cfg.rows_per_chunk:
            return generate(policy.base, self.model_config, tokens, mask, key, **settings)
        return generate_chunked(
            policy.base,
            self.model_config,
            tokens,
            mask,
            key,
            rows_per_chunk=cfg.rows_per_chunk,
            **settings,
        )

    def _score(
        self,
        policy: FrozenPolicy,
        trainable: Any,
        tokens: jax.Array,
        attention_mask: jax.Array,
        with_policy: bool = True,
        with_ref: bool = False,
    ) -> tuple[jax.Array | None, jax.Array | None]:
        """(policy, reference) log-probs [B, T-1] of `tokens`; the reference is the base model
        with the adapter disabled (lora=None)."""
        out = []
        for on, lora in ((with_policy, self.to_lora(trainable, policy.adapter)), (with_ref, None)):
            if not on:
                out.append(None)
                continue
            out.append(
                sequence_logprobs(
                    policy.base,
                    self.model_config,
                    tokens,
                    attention_mask,
                    lora=lora,
                    temperature=self.cfg.temperature,
                    remat=self.cfg.remat,
                )
            )
        return out[0], out[1]

    def loss(
        self, policy: FrozenPolicy, trainable: Any, batch: RolloutBatch
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The policy loss of `batch` under `trainable` (to be minimised) and its diagnostics."""
        cfg = self.cfg
        num_new = batch.completion_mask.shape[1]
        lp, ent = sequence_logprobs(
            policy.base,
            self.model_config,
            batch.tokens,
            batch.attention_mask,
            lora=self.to_lora(trainable, policy.adapter),
            temperature=cfg.temperature,
            return_entropy=True,
            remat=cfg.remat,
        )
        lp, ent = _split_completion(lp, num_new), _split_completion(ent, num_new)
        old = jax.lax.stop_gradient(lp) if batch.old_logp is None else batch.old_logp
        return policy_loss(
            lp,
            old,
            batch.advantages,
            batch.completion_mask,
            kind=cfg.loss,
            eps_low=cfg.eps_low,
            eps_high=cfg.eps_high,
            agg=cfg.agg,
            max_len=cfg.norm_len,
            ref_logp=batch.ref_logp,
            beta=cfg.beta,
            entropy=ent,
        )

    def loss_and_grad(
        self, policy: FrozenPolicy, trainable: Any, batch: RolloutBatch
    ) -> tuple[tuple[jax.Array, dict[str, jax.Array]], Any]:
        """((loss, aux), d loss / d trainable) of a mini-batch of B rollouts.

        cfg.micro_batch_size = 0 (or B): one pass. Else gradient accumulation: the B rows split
        into B / micro_batch_size contiguous micro-batches under `lax.scan` (one micro-batch's
        activations alive at a time), whose losses and gradients add with the weights of
        `micro_batch_weights`, so that every aggregation keeps the mini-batch's normaliser
        (token_mean: its token count; the sequence means: its row count). The update equals the
        whole-batch one up to summation order; aux is `combine_micro_batch_aux`'s.
        """
        grad_fn = jax.value_and_grad(self.loss, argnums=1, has_aux=True)
        B = batch.tokens.shape[0]
        mbs = self.cfg.micro_batch_size
        if not mbs or mbs == B:
            return grad_fn(policy, trainable, batch)
        self.cfg.check_micro_batch(B)
        n = B // mbs
        micro = jax.tree.map(lambda x: x.reshape(n, mbs, *x.shape[1:]), batch)
        weights = micro_batch_weights(micro.completion_mask, self.cfg.agg)  # [n]

        def one(acc, xs):
            mb, w = xs
            (loss, aux), g = grad_fn(policy, trainable, mb)
            acc = jax.tree.map(lambda a, gi: a + w.astype(gi.dtype) * gi, acc, g)
            return acc, (loss, aux)

        zero = jax.tree.map(jnp.zeros_like, trainable)
        grads, (losses, auxs) = jax.lax.scan(one, zero, (micro, weights))
        aux = combine_micro_batch_aux(auxs, micro.completion_mask, weights)
        return (jnp.sum(weights * losses), aux), grads

    def _update_step(
        self, policy: FrozenPolicy, trainable: Any, opt_state: Any, batch: RolloutBatch
    ) -> tuple[Any, Any, dict[str, jax.Array]]:
        """One optax update on one mini-batch: (trainable, opt_state, metrics).

        Pure and jitted as `update_step`; lowerable with `jax.ShapeDtypeStruct` leaves for every
        argument (a memory planner: `update_step.lower(...).compile().memory_analysis()`).
        """
        (loss, aux), grads = self.loss_and_grad(policy, trainable, batch)
        updates, opt_state = self.optimizer.update(grads, opt_state, trainable)
        trainable = optax.apply_updates(trainable, updates)
        metrics = {
            **aux,
            "loss": loss,
            "grad_norm": optax.tree.norm(grads),
            "update_norm": optax.tree.norm(updates),
        }
        return trainable, opt_state, metrics

    # -- the host step

    def make_batch(
        self,
        policy: FrozenPolicy,
        trainable: Any,
        prompt_tokens: jax.Array,
        prompt_mask: jax.Array,
        gen: Generation,
        rewards: jax.Array,
    ) -> tuple[RolloutBatch, dict[str, jax.Array]]:
        """Assemble the optimisation batch (advantages, old / reference log-probs) of a rollout."""
        cfg = self.cfg
        n = cfg.group_size
        tokens = jnp.concatenate([jnp.repeat(prompt_tokens, n, 0), gen.tokens], axis=1)
        attn = jnp.concatenate(
            [jnp.repeat(prompt_mask, n, 0).astype(jnp.int32), gen.mask.astype(jnp.int32)], axis=1
        )
        comp_mask = gen.mask.astype(jnp.float32)
        advantages, weights = compute_advantages(rewards, cfg)
        multi_update = cfg.epochs * cfg.num_minibatches > 1
        need_old = multi_update and not cfg.use_generation_logprobs
        need_ref = cfg.beta > 0
        old = ref = None
        if need_old or need_ref:
            old, ref = self.score(
                policy, trainable, tokens, attn, with_policy=need_old, with_ref=need_ref
            )
            num_new = gen.tokens.shape[1]
            old = None if old is None else _split_completion(old, num_new)
            ref = None if ref is None else _split_completion(ref, num_new)
        if cfg.use_generation_logprobs:
            old = gen.logprobs
        batch = RolloutBatch(
            tokens=tokens,
            attention_mask=attn,
            completion_mask=comp_mask,
            advantages=advantages,
            old_logp=old,
            ref_logp=ref,
        )
        return batch, {"focal_weight_mean": jnp.mean(weights)}

    def step(
        self,
        state: GRPOState,
        policy: FrozenPolicy,
        prompt_tokens: jax.Array,
        prompt_mask: jax.Array,
        prompts: Sequence[Any],
        **task_fields: Sequence[Any],
    ) -> tuple[GRPOState, dict[str, float]]:
        """One GRPO-family step on P prompts: P * group_size rollouts, then the updates.

        Args:
          state: `GRPOState`.
          policy: `FrozenPolicy(base params, frozen adapter)`.
          prompt_tokens, prompt_mask: [P, Tp] left-padded prompts (keep Tp fixed across steps
            to avoid recompiling).
          prompts: the P prompts as the reward function expects them (text or chat messages).
          task_fields: per-prompt fields passed to the reward function (e.g. answer=[...]).

        Returns:
          (new state, metrics): floats, see the module docstring of `essa_jax.rl`.
        """
        cfg = self.cfg
        num_prompts = prompt_tokens.shape[0]
        if len(prompts) != num_prompts:
            raise ValueError(f"{len(prompts)} prompts for {num_prompts} rows of prompt_tokens")
        for name, vals in task_fields.items():
            if len(vals) != num_prompts:
                raise ValueError(f"task field {name!r} has {len(vals)} values for {num_prompts}")
        num_rollouts = num_prompts * cfg.group_size
        cfg.check_batch(num_rollouts)

        key = jax.random.wrap_key_data(state.key)
        key, k_roll, k_shuffle = jax.random.split(key, 3)

        t0 = time.perf_counter()
        gen = jax.block_until_ready(
            self.rollout(policy, state.params, prompt_tokens, prompt_mask, k_roll)
        )
        t_roll = time.perf_counter() - t0

        t0 = time.perf_counter()
        lengths = np.asarray(gen.lengths)
        finished = np.asarray(gen.finished)
        completions = decode_completions(self.decode, gen.tokens, lengths, self.eos_token_ids)
        rep = lambda xs: [x for x in xs for _ in range(cfg.group_size)]  # noqa: E731
        rewards = self.reward_fn(
            rep(prompts), completions, **{k: rep(v) for k, v in task_fields.items()}
        )
        if len(rewards) != num_rollouts:
            raise ValueError(f"reward_fn returned {len(rewards)} rewards for {num_rollouts}")
        rewards = jnp.asarray(np.asarray(rewards, np.float32))
        t_reward = time.perf_counter() - t0

        t0 = time.perf_counter()
        batch, extra = self.make_batch(
            policy, state.params, prompt_tokens, prompt_mask, gen, rewards
        )
        jax.block_until_ready(batch)
        t_score = time.perf_counter() - t0

        t0 = time.perf_counter()
        params, opt_state = state.params, state.opt_state
        mb = num_rollouts // cfg.num_minibatches
        per_update = []
        for epoch in range(cfg.epochs):
            if cfg.num_minibatches > 1:
                perm = jax.random.permutation(jax.random.fold_in(k_shuffle, epoch), num_rollouts)
            else:
                perm = None
            for j in range(cfg.num_minibatches):
                if perm is None:
                    sub = batch
                else:
                    idx = perm[j * mb : (j + 1) * mb]
                    sub = jax.tree.map(lambda x, idx=idx: x[idx], batch)
                params, opt_state, m = self.update_step(policy, params, opt_state, sub)
                per_update.append(m)
        per_update = jax.device_get(per_update)
        t_update = time.perf_counter() - t0

        new_state = GRPOState(
            params=params,
            opt_state=opt_state,
            step=state.step + 1,
            key=jax.random.key_data(key),
        )
        r = np.asarray(rewards)
        num_tokens = float(lengths.sum())
        metrics = {
            "reward_mean": float(r.mean()),
            "reward_std": float(r.std()),
            "zero_variance_frac": float(zero_variance_fraction(rewards, cfg.group_size)),
            "focal_weight_mean": float(extra["focal_weight_mean"]),
            "completion_len_mean": float(lengths.mean()),
            "truncation_rate": float(1.0 - finished.mean()),
            "rollout_s": t_roll,
            "reward_s": t_reward,
            "score_s": t_score,
            "update_s": t_update,
            "step_s": t_roll + t_reward + t_score + t_update,
        }
        metrics["tokens_per_s"] = num_tokens / metrics["step_s"]
        metrics["rollout_tokens_per_s"] = num_tokens / max(t_roll, 1e-9)
        # Update diagnostics: mean over the step's updates, except the ratio extremes.
        reduce = {"ratio_min": np.min, "ratio_max": np.max}
        for k in per_update[0]:
            vals = np.asarray([float(m[k]) for m in per_update])
            metrics[k] = float(reduce.get(k, np.mean)(vals))
        return new_state, metrics
