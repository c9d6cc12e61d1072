"""Methods: one registered object per training method the runner knows, and the validation that
asks it (docs/ARCHITECTURE.md, "Configuration").

A method owns what distinguishes it: the checks of its config section (`validate`, and
`check_rows` for its micro-batches on a mesh), the loop the pipeline drives (`make_loop`) and
the compiled programs that loop runs, built from abstract inputs for the ahead-of-time plan
(`programs`), with the same constructors the loop uses, so the plan compiles what the run
compiles. `config.method` names one entry of the registry; `register_method` adds a user's (in a
module the config file imports). Nothing outside a method tests its name.

Built in: "essa" (ESSA, arXiv 2507.04453 Alg. 1), "grpo" (GRPO with the estimator and weighting
its section names), "fgrpo" (the preset: GRPO + the focal weighting, F-GRPO arXiv 2602.06717),
"svdgrpo" (GRPO on ESSA's genome, ESSA Sec. 5), "sft" (SFT only, then evaluation).

A loop (what `make_loop` returns; None = SFT only) has `total_steps`, `init_state(key, sft_lora)
-> state` (a pytree with an int `step`), `step(state) -> (state, metrics with "reward", tokens)`,
`policy_lora(state)` (the adapter to evaluate) and `export_lora(state)` (dense PEFT factors).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from essa_jax.config import ConfigError, check_fields, check_micro_batches, data_axis, device_count
from essa_jax.train.programs import Program, ProgramInputs


@dataclasses.dataclass(frozen=True)
class Method:
    """A method: SFT (when `needs_sft`, at least one step: ESSA's singular values of a
    zero-initialised LoRA B are all 0), then its loop. This base class is the "sft" method (no
    loop, no section, no programs beyond SFT and evaluation); subclasses override the hooks."""

    name: str
    needs_sft: bool = True
    # Whether it can train the model's weights instead of an adapter (`train.params` "full" /
    # "projections", `lora.full`): a gradient method on the model's own parameters.
    trains_weights: bool = True

    def validate(self, config: Any, num_devices: int, model_config: Any) -> None:
        """Check the method's own config section; raise ConfigError naming the field."""

    def check_rows(self, config: Any, data: int) -> None:
        """Check its micro-batch sizes against the rows each of `data` devices holds."""

    def make_loop(self, run: Any) -> Any:
        """The loop the pipeline drives on `run` (`essa_jax.train.pipeline.Run`); None = none."""
        return None

    def programs(self, inputs: ProgramInputs) -> list[Program]:
        """The compiled programs its loop runs, lowerable from `inputs` (abstract)."""
        return []


@dataclasses.dataclass(frozen=True)
class ESSAMethod(Method):
    """ESSA: SFT -> SVD -> an ES strategy on the singular values (section `essa`)."""

    def validate(self, config: Any, num_devices: int, model_config: Any) -> None:
        from essa_jax.config import peek_or_none
        from essa_jax.train.essa import check_essa_section

        shape = model_config if model_config is not None else peek_or_none(config.model.path)
        check_essa_section(config, shape)

    def make_loop(self, run: Any) -> Any:
        from essa_jax.train.essa import ESSALoop

        return ESSALoop(run)

    def programs(self, inputs: ProgramInputs) -> list[Program]:
        from essa_jax.train.essa import population_program

        return [population_program(inputs)]


@dataclasses.dataclass(frozen=True)
class GRPOMethod(Method):
    """The GRPO family (section `grpo`): `svd` trains ESSA's genome instead of the LoRA factors
    (SVD-GRPO), `weighting` presets the advantage weighting (None: `grpo.weighting`)."""

    needs_sft: bool = False
    svd: bool = False
    weighting: str | None = None

    @property
    def variant(self) -> Any:
        from essa_jax.train.grpo import GRPOVariant

        return GRPOVariant(svd=self.svd, weighting=self.weighting)

    def validate(self, config: Any, num_devices: int, model_config: Any) -> None:
        from essa_jax.train.grpo import check_grpo_section

        check_grpo_section(config, self.variant)

    def check_rows(self, config: Any, data: int) -> None:
        from essa_jax.train.grpo import check_grpo_rows

        check_grpo_rows(config, self.variant, data)

    def make_loop(self, run: Any) -> Any:
        from essa_jax.train.grpo import GRPOLoop

        return GRPOLoop(run, self.variant)

    def programs(self, inputs: ProgramInputs) -> list[Program]:
        from essa_jax.train.grpo import grpo_programs

        return grpo_programs(inputs, self.variant)


_METHODS: dict[str, Method] = {}


def register_method(method: Method, *, overwrite: bool = False) -> Method:
    """Register `method` under `method.name`, so `config.method` can name it; returns it.

    A user's method subclasses `Method` (hooks: validate, check_rows, make_loop, programs), or is
    a preset of a built-in one, e.g. `register_method(GRPOMethod("dapo_focal",
    weighting="focal"))`. Re-registering a name raises unless `overwrite=True`."""
    if not isinstance(method, Method):
        raise TypeError(f"register_method takes a Method (essa_jax.train.methods), got {method!r}")
    if not isinstance(method.name, str) or not method.name:
        raise ValueError(f"a method name must be a non-empty string, got {method.name!r}")
    if method.name in _METHODS and not overwrite and _METHODS[method.name] != method:
        raise ValueError(f"method {method.name!r} is already registered: {_METHODS[method.name]}")
    _METHODS[method.name] = method
    return method


def method_names() -> tuple[str, ...]:
    """The registered methods' names, in registration order."""
    return tuple(_METHODS)


def get_method(name: str) -> Method:
    """The method registered as `name`; ConfigError on `method` naming the registered ones."""
    if name not in _METHODS:
        raise ConfigError(
            "method",
            name,
            " | ".join(map(repr, _METHODS)),
            "register a method with essa_jax.train.methods.register_method in a module the "
            "config file imports",
        )
    return _METHODS[name]


for _m in (
    ESSAMethod("essa", trains_weights=False),
    GRPOMethod("grpo"),
    GRPOMethod("fgrpo", weighting="focal"),
    GRPOMethod("svdgrpo", needs_sft=True, svd=True, trains_weights=False),
    Method("sft"),
):
    register_method(_m)


def validate_config(config: Any, num_devices: int | None = None, *, model_config: Any = None):
    """Check every field of `config`; raise ConfigError on the first (before any weight is read).

    The method first (an unknown name is the first thing to fix), then the fields no method owns
    (`config.check_fields`: the schema, model, task, lora, sft, mesh, eval, checkpoint), then the
    method's own section (`Method.validate`), then the micro-batches (`check_rows`).
    `num_devices` defaults to `jax.device_count()`; `model_config` (a `ModelConfig`) checks
    against that shape instead of reading `model.path` (the ahead-of-time plan)."""
    method = get_method(config.method)
    num_devices = device_count() if num_devices is None else num_devices
    check_fields(config, num_devices, model_config=model_config)
    if method.needs_sft and config.sft.steps == 0:
        raise ConfigError(
            "sft.steps",
            0,
            "integers >= 1 for method " + repr(config.method),
            "it starts from an SFT warm start: singular values of a zero-initialised LoRA B are "
            "all 0",
        )
    if config.train.params != "lora" and not method.trains_weights:
        able = [n for n, m in _METHODS.items() if m.trains_weights]
        raise ConfigError(
            "train.params",
            config.train.params,
            f"'lora' for method {config.method!r}",
            f"the model's weights are trained by methods {' | '.join(able)}",
        )
    method.validate(config, num_devices, model_config)
    check_rows(config, data_axis(config, num_devices))


def check_rows(config: Any, data: int) -> None:
    """The micro-batch sizes (SFT's, the method's) against the rows each of `data` devices holds
    (they count rows per device: ceil(batch / data)); raises ConfigError naming the field."""
    check_micro_batches(config, data)
    get_method(config.method).check_rows(config, data)
