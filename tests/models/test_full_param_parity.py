"""Full-parameter GRPO against transformers (torch CPU, float32): on a tiny Llama (untied head)
and a tiny Qwen2 (q/k/v biases, tied head), one batch with given old and reference log-probs,
our loss (`GRPOPrograms.loss_and_grad` with `lora.full.full_policy`) and the gradient of every
weight equal the loss written out in torch and its autograd gradients, named by
`models.export.hf_state_dict`."""

import jax
import numpy as np
import pytest

from essa_jax.lora.full import full_policy, merge_weights
from essa_jax.models import load_pretrained
from essa_jax.models.export import hf_state_dict
from essa_jax.rl import FrozenPolicy, GRPOConfig, GRPOTrainer, RolloutBatch

torch = pytest.importorskip("torch")

EPS32 = float(np.finfo(np.float32).eps)
B, TP, N = 4, 6, 5
TEMPERATURE = 0.8
# (loss kind, eps_low, eps_high, aggregation, beta): GRPO with DAPO's clip-higher, token mean and
# a KL term; CISPO with Dr.GRPO's constant normaliser.
LOSSES = {
    "dapo_kl": ("grpo", 0.2, 0.28, "token_mean", 0.04),
    "cispo_drgrpo": ("cispo", 1.0, 0.3, "seq_mean_token_sum_norm", 0.0),
}


def _batch(vocab, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(3, vocab, (B, TP + N)).astype(np.int32)
    attn = np.ones((B, TP + N), np.int32)
    attn[1, :2] = 0  # left padding
    tokens[1, :2] = 0
    comp = np.ones((B, N), np.float32)
    comp[2, 3:] = 0  # a completion that ended early
    attn[2, TP + 3 :] = 0
    adv = np.asarray([1.0, -0.5, 0.3, -1.2], np.float32)
    return tokens, attn, comp, adv


def _torch_logp(model, tokens, attn):
    t = torch.as_tensor(tokens, dtype=torch.long)
    m = torch.as_tensor(attn, dtype=torch.long)
    pos = torch.clamp(torch.cumsum(m, 1) - 1, min=0)  # ours: cumsum(mask) - 1, clipped at 0
    logits = model(input_ids=t, attention_mask=m, position_ids=pos).logits[:, -N - 1 : -1]
    lp = torch.log_softmax(logits.float() / TEMPERATURE, -1)
    return torch.gather(lp, -1, t[:, -N:, None])[..., 0]


def _torch_loss(logp, old, ref, adv, comp, kind, eps_low, eps_high, agg, beta):
    """rl.losses.policy_loss written out (GRPO arXiv 2402.03300 Eq. 4 with DAPO's clip-higher,
    arXiv 2503.14476; CISPO arXiv 2506.13585 Eq. 4; Dr.GRPO's sum / (B * max_len))."""
    old, ref = torch.as_tensor(old), torch.as_tensor(ref)
    a, m = torch.as_tensor(adv)[:, None], torch.as_tensor(comp)
    ratio = torch.exp(logp - old)
    clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    if kind == "grpo":
        per_tok = -torch.minimum(ratio * a, clipped * a)
    else:
        per_tok = -clipped.detach() * a * logp

    def agg_(x):
        if agg == "token_mean":
            return (x * m).sum() / m.sum().clamp(min=1)
        return (x * m).sum() / (B * N)

    loss = agg_(per_tok)
    if beta:
        d = ref - logp
        loss = loss + beta * agg_(torch.exp(d) - d - 1)
    return loss


@pytest.mark.parametrize("loss_name", list(LOSSES))
@pytest.mark.parametrize(
    "arch,tied", [("llama", False), ("qwen2", True)], ids=["llama_untied", "qwen2_bias_tied"]
)
def test_full_parameter_grpo_loss_and_every_gradient_match_transformers(
    tmp_path, save_hf, arch, tied, loss_name
):
    kind, eps_low, eps_high, agg, beta = LOSSES[loss_name]
    model = save_hf(tmp_path, arch, tied=tied)
    config, params = load_pretrained(tmp_path)
    tokens, attn, comp, adv = _batch(config.vocab_size)
    with torch.no_grad():
        lp0 = _torch_logp(model, tokens, attn).numpy()
    rng = np.random.default_rng(1)
    # Old / reference log-probs off the current ones, so ratios leave the clip range both ways.
    old = (lp0 + 0.3 * rng.standard_normal(lp0.shape)).astype(np.float32)
    ref = (lp0 + 0.2 * rng.standard_normal(lp0.shape)).astype(np.float32)

    model.zero_grad()
    ref_loss = _torch_loss(
        _torch_logp(model, tokens, attn), old, ref, adv, comp, kind, eps_low, eps_high, agg, beta
    )
    ref_loss.backward()
    ref_grads = {n: p.grad.numpy() for n, p in model.named_parameters()}

    cfg = GRPOConfig(
        group_size=B,
        loss=kind,
        eps_low=eps_low,
        eps_high=eps_high,
        agg=agg,
        beta=beta,
        temperature=TEMPERATURE,
        max_new_tokens=N,
    )
    trainable, frozen, to_lora = full_policy(params, "full")
    trainer = GRPOTrainer(
        config,
        cfg,
        to_lora=to_lora,
        to_params=merge_weights,
        reward_fn=lambda *a, **k: [],
        decode=str,
    )
    batch = RolloutBatch(tokens, attn, comp, adv, old_logp=old, ref_logp=ref)
    (loss, aux), grads = jax.jit(trainer.loss_and_grad)(
        FrozenPolicy(params, frozen), trainable, batch
    )
    ours = hf_state_dict(grads, config)

    # Clipping is active on both sides of the range: the test covers the min / clip branches.
    assert float(aux["clip_low_frac"]) + float(aux["clip_high_frac"]) > 0
    # float32 on both sides, summed in different orders: each value passes through reductions of
    # at most n = hidden + intermediate + vocab + B * (Tp + N) terms, per layer and pass
    # (forward, backward: 2 * (layers + 1)); the rounding of a sum of n terms is <= n eps of the
    # largest magnitude (Higham 2002, Sec. 4.2).
    n = config.hidden_size + config.intermediate_size + config.vocab_size + B * (TP + N)
    rel = n * EPS32 * 2 * (config.num_layers + 1)
    np.testing.assert_allclose(
        float(loss), ref_loss.item(), rtol=rel, atol=rel * abs(ref_loss.item())
    )
    assert set(ours) == set(ref_grads), set(ours) ^ set(ref_grads)
    for name, g in ref_grads.items():
        scale = float(np.abs(g).max())
        assert scale > 0, name  # every weight gets a gradient
        np.testing.assert_allclose(ours[name], g, rtol=0, atol=rel * scale, err_msg=name)
