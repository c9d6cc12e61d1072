"""A study as a config file: tasks x SFT starts x arms x seeds, with an equal-effort sweep per arm.

A study file defines `get_study()` returning a dict (the schema is `study_defaults`: override
dicts hold dotted config field names, which ConfigDict keys cannot); `plan_study` turns it into
`RunSpec`s, each one `python -m essa_jax.main` run in its own workdir, in three stages that
depend on each other:

1. **start**: one SFT run per (task, start, SFT-shaping fields such as `lora.rank`), method "sft",
   early-stopped on the validation split; its `adapter/` is every later run's `sft.init_from`, so
   all arms of a task start from the identical SFT model.
2. **sweep**: per arm, one factor at a time around the arm's own settings (the "center" run plus
   one run per other value of each factor), on `sweep_task`, seed `sweep_seed`, at
   `sweep_budget` CPU seconds, scored on validation only (`eval.read_test = False`). Every arm
   gets the same number of sweep runs when the study says so (`check_equal_effort`). The chosen
   value of each factor is the one with the best final validation accuracy (ties: the higher mean
   validation curve; `choose`), and a chosen value at the edge of a numeric grid is flagged.
3. **final**: per (task, arm, seed), at the arm's settings with the chosen sweep values, for
   `budget` CPU seconds (`max_cpu_seconds`), reading the test set once at the end.

Workdirs: `<out>/<task>/<name>/seed<k>` (start: `sft_<start>[_<shape>]`, sweep: `sweep_<arm>_<i>`,
final: `<arm>`). Everything here is pure planning: `essa_jax.study.runner` runs the specs.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

# Overrides that shape the SFT model: an arm (or a sweep value) that sets one of them needs a start
# trained with it (e.g. lora.rank 8 needs a rank-8 SFT adapter).
START_FIELDS = ("lora.rank", "lora.alpha", "lora.targets")
STAGES = ("start", "sweep", "final")
ARM_KEYS = ("config", "start", "overrides", "tasks", "seeds", "sweep", "hold", "extend")


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run of a study: `python -m essa_jax.main --config <config> --workdir <workdir>` with
    `overrides` (`--config.<field>=<value>`), after the runs whose workdirs are in `after`."""

    stage: str
    task: str
    name: str  # the start's, sweep run's or arm's name
    seed: int
    config: str
    overrides: Mapping[str, Any]
    workdir: str
    after: tuple[str, ...] = ()
    arm: str = ""  # the arm a sweep / final run belongs to
    factor: str = ""  # sweep runs: the factor varied ("" = the center run)
    value: Any = None  # sweep runs: its value
    extension: bool = False  # sweep runs: of the arm's "extend" (beyond its registered grid)

    @property
    def label(self) -> str:
        extra = f" {self.factor}={self.value}" if self.factor else ""
        return f"{self.stage} {self.task} {self.name} seed {self.seed}{extra}"


class Study(dict):
    """A study's fields as attributes (`study.arms`), over a plain dict."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value


def study_defaults() -> Study:
    """The schema of a study file's `get_study()` (every field it may set, with its default)."""
    s = Study()
    s.name = ""
    s.out = ""  # workdirs; "" = runs/<name>
    s.archive = ""  # committed run records; "" = experiments/results/<name>_runs
    s.results = ""  # the report; "" = experiments/results/<name>.json
    s.seeds = (0, 1, 2)  # search seeds of the final runs (config.search_seed)
    s.config_seed = 0  # config.seed of every run: task data, SFT, evaluation problems
    s.budget = 900.0  # CPU seconds of loop per final run (max_cpu_seconds)
    s.sweep_budget = 600.0  # CPU seconds of loop per sweep run
    s.eval_seconds = 150.0  # a validation evaluation every this many seconds of loop clock
    s.num_validation = 200
    s.common = {}  # overrides of every sweep and final run (not of the starts)
    s.tasks = {}  # task name -> overrides (task.name, prompt format, generation length, ...)
    # start name -> {"config": path, "overrides": {...}}: one SFT run per task (and shape).
    s.starts = {}
    # arm name -> {"config": path, "overrides": {...}, "start": start name, "tasks": (...) or
    # () for every task, "seeds": (...) or () for `seeds`, "sweep": {factor: values}}; a
    # factor is a field name or several joined by "," whose values are tuples (population x
    # prompts at a fixed rollout count), "hold": (factors swept and reported, but kept at the
    # arm's own value in the final runs, e.g. a setting the protocol fixes), "extend": {factor:
    # values beyond its grid}: when a choice sits at the edge of a numeric grid, the bracketing
    # rule grows that grid outward; the runs come after the registered sweep (whose run names
    # stay), are counted apart from `sweep_runs` and reported as extensions}.
    s.arms = {}
    s.sweep_task = ""  # "" = the first task
    s.sweep_seed = 0
    # Sweep runs every arm must have (0 = no check): equal tuning effort, by construction.
    s.sweep_runs = 0
    # A sweep factor that changes the SFT start (a START_FIELDS field, e.g. lora.rank) needs its
    # own start, whose accuracy differs from the others': scored by its gain over that start, and
    # with hold_start its final runs keep the arm's own value, so every arm of a task starts from
    # the identical SFT model (what the factor showed is reported, not chosen). False: chosen like
    # any other factor, on that gain.
    s.hold_start = True
    # Final runs' load flag: a run whose loop CPU seconds are below this fraction of its loop
    # wall-clock shared its core with other work (report.flags).
    s.min_cpu_share = 0.9
    # The report: targets fixed before the runs, as gains over the SFT start's validation
    # accuracy (time to target in updates, rollouts and CPU seconds), arm pairs compared (a, b:
    # a - b), and the pair whose measured update ratio to a target feeds the cost model
    # (`essa_jax.scaling.compare_with_paper`, per-step times of the paper-scale configs from
    # `scaling_results`): (ES arm, gradient arm).
    s.targets = (0.05, 0.10, 0.15)
    s.compare = ()
    s.step_ratio_arms = ()
    s.scaling_results = "experiments/results/scaling.json"
    return s


def load_study(path: str) -> Study:
    """The study of the file `path` (its `get_study()`), checked against `study_defaults`:
    ValueError naming an unknown field or a missing piece."""
    if not os.path.isfile(path):
        raise ValueError(f"study file {path!r} does not exist")
    spec = importlib.util.spec_from_file_location("_study_file", path)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    if not hasattr(module, "get_study"):
        raise ValueError(f"study file {path} defines no get_study()")
    got = module.get_study()
    if not isinstance(got, Mapping):
        raise ValueError(f"{path}: get_study() returned {type(got).__name__}, not a dict")
    study = study_defaults()
    unknown = sorted(set(got) - set(study))
    if unknown:
        raise ValueError(f"{path}: unknown study fields {unknown}; valid: {sorted(study.keys())}")
    study.update(got)
    if not study.name:
        raise ValueError(f"{path}: the study needs a name")
    study.out = study.out or os.path.join("runs", study.name)
    study.archive = study.archive or os.path.join("experiments", "results", f"{study.name}_runs")
    study.results = study.results or os.path.join("experiments", "results", f"{study.name}.json")
    if not study.tasks or not study.arms:
        raise ValueError(f"{path}: a study needs tasks and arms")
    for name, arm in study.arms.items():
        bad = sorted(set(arm) - set(ARM_KEYS))
        if bad:
            raise ValueError(
                f"{path}: arm {name!r} has unknown keys {bad}; valid: {list(ARM_KEYS)}"
            )
        for factor in arm.get("hold", ()) or ():
            if factor not in dict(arm.get("sweep") or {}):
                raise ValueError(
                    f"{path}: arm {name!r} holds {factor!r}, which it does not sweep; its sweep "
                    f"factors: {sorted(dict(arm.get('sweep') or {}))}"
                )
        _check_extend(path, name, arm)
        if arm.get("start") and arm["start"] not in study.starts:
            raise ValueError(
                f"{path}: arm {name!r} starts from {arm['start']!r}; starts: {sorted(study.starts)}"
            )
        for task in arm.get("tasks", ()) or ():
            if task not in study.tasks:
                raise ValueError(
                    f"{path}: arm {name!r} names task {task!r}; tasks: {sorted(study.tasks)}"
                )
    return study


def _check_extend(path: str, name: str, arm: Mapping[str, Any]) -> None:
    """An arm's "extend" grows a swept numeric factor's grid outward (a value inside the grid's
    range would be more tuning, not bracketing): ValueError otherwise."""
    sweep = dict(arm.get("sweep") or {})
    for factor, values in dict(arm.get("extend") or {}).items():
        if factor not in sweep:
            raise ValueError(
                f"{path}: arm {name!r} extends {factor!r}, which it does not sweep; its sweep "
                f"factors: {sorted(sweep)}"
            )
        grid = list(sweep[factor])
        if not all(isinstance(v, int | float) for v in [*grid, *values]):
            raise ValueError(
                f"{path}: arm {name!r} extends {factor!r}: only a numeric grid can be extended"
            )
        inside = [v for v in values if min(grid) <= v <= max(grid)]
        if inside:
            raise ValueError(
                f"{path}: arm {name!r} extends {factor!r} with {inside}, inside its grid "
                f"[{min(grid)}, {max(grid)}]: an extension lies below or above the grid"
            )


def grid(arm_spec: Mapping[str, Any], factor: str) -> list[Any]:
    """A sweep factor's values: its registered grid, then its extension ("extend")."""
    return [
        *dict(arm_spec.get("sweep") or {})[factor],
        *dict(arm_spec.get("extend") or {}).get(factor, ()),
    ]


def _plain(d: Any) -> dict[str, Any]:
    """A ConfigDict / mapping as a plain dict of plain values (tuples kept)."""
    if hasattr(d, "to_dict"):
        d = d.to_dict()
    return dict(d or {})


def factor_fields(factor: str) -> tuple[str, ...]:
    """The config fields a sweep factor sets: "a,b" -> ("a", "b")."""
    return tuple(f.strip() for f in factor.split(","))


def factor_overrides(factor: str, value: Any) -> dict[str, Any]:
    """The overrides of one sweep value: a joint factor ("a,b") takes a tuple of values."""
    fields = factor_fields(factor)
    if len(fields) == 1:
        return {fields[0]: value}
    if not isinstance(value, Sequence) or len(value) != len(fields):
        raise ValueError(f"sweep factor {factor!r} needs {len(fields)}-tuples, got {value!r}")
    return dict(zip(fields, value, strict=True))


@functools.cache
def _config_shape(config_path: str) -> dict[str, Any]:
    """The START_FIELDS of a config file as it stands (no overrides)."""
    from essa_jax.config import load_config_file

    c = load_config_file(config_path)
    return {k: _get(c, k) for k in START_FIELDS}


def _get(config: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        config = config[part]
    return tuple(config) if isinstance(config, list | tuple) else config


def _shape(config_path: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The SFT-shaping fields (START_FIELDS) a run with these overrides resolves to."""
    shape = dict(_config_shape(config_path))
    for k in START_FIELDS:
        if k in overrides:
            v = overrides[k]
            shape[k] = tuple(v) if isinstance(v, list | tuple) else v
    return shape


def _shape_key(shape: Mapping[str, Any], default: Mapping[str, Any]) -> str:
    """A short stable name of `shape` where it differs from the start's `default` ("" when not)."""
    if dict(shape) == dict(default):
        return ""
    text = json.dumps(dict(sorted(shape.items())), default=list)
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def changes_start(factor: str) -> bool:
    """Whether a sweep factor sets a field that shapes the SFT start (START_FIELDS)."""
    return any(f in START_FIELDS for f in factor_fields(factor))


def held_factors(study: Any, arm: str) -> tuple[str, ...]:
    """The arm's sweep factors whose final value is the arm's own, not the sweep's choice: its
    "hold" list, and with `study.hold_start` every factor that changes the SFT start."""
    spec = study.arms[arm]
    hold = set(spec.get("hold") or ())
    return tuple(
        f
        for f in dict(spec.get("sweep") or {})
        if f in hold or (study.hold_start and changes_start(f))
    )


def center_values(study: Any, arm: str) -> dict[str, Any]:
    """Each sweep factor's value at the arm's own settings (its overrides, else its config file's
    value): the center run of the one-factor-at-a-time design."""
    from essa_jax.config import load_config_file

    spec = study.arms[arm]
    ov = _plain(spec.get("overrides"))
    config = None
    out = {}
    for factor in _plain(spec.get("sweep")):
        values = []
        for field in factor_fields(factor):
            if field in ov:
                values.append(ov[field])
                continue
            config = config if config is not None else load_config_file(spec["config"])
            values.append(_get(config, field))
        out[factor] = values[0] if len(values) == 1 else tuple(values)
    return out


def plan_study(study: Any, chosen: Mapping[str, Mapping[str, Any]] | None = None) -> list[RunSpec]:
    """Every run of `study` (module docstring). `chosen` (arm -> factor -> value, from
    `runner.choices`) fixes the final runs' sweep values; arms whose sweep is not decided yet get
    no final runs (their sweep runs come first)."""
    chosen = chosen or {}
    runs: list[RunSpec] = []
    starts: dict[tuple[str, str, str], RunSpec] = {}
    sweep_task = study.sweep_task or next(iter(study.tasks))

    def start_for(task: str, start: str, shape: Mapping[str, Any]) -> RunSpec | None:
        if not start:
            return None
        spec = study.starts[start]
        default = _shape(spec["config"], _plain(spec.get("overrides")))
        key = (task, start, _shape_key(shape, default))
        if key not in starts:
            name = f"sft_{start}" + (f"_{key[2]}" if key[2] else "")
            # `common` is the loop runs' (budgets, pass@k, checkpoints): a start sets its own.
            ov = {
                **_plain(study.tasks[task]),
                **_plain(spec.get("overrides")),
                **{k: v for k, v in shape.items() if v != default[k]},
                "method": "sft",
                "seed": int(study.config_seed),
                "task.num_validation": int(study.num_validation),
            }
            starts[key] = RunSpec(
                "start",
                task,
                name,
                0,
                spec["config"],
                ov,
                os.path.join(study.out, task, name, "seed0"),
            )
        return starts[key]

    def loop_run(
        stage: str, task: str, arm: str, name: str, seed: int, extra: Mapping[str, Any], budget
    ) -> RunSpec:
        spec = study.arms[arm]
        ov = {
            **_plain(study.common),
            **_plain(study.tasks[task]),
            **_plain(spec.get("overrides")),
            **dict(extra),
            "seed": int(study.config_seed),
            "search_seed": int(seed),
            "task.num_validation": int(study.num_validation),
            "max_cpu_seconds": float(budget),
            "max_wall_seconds": 0.0,
            "eval.every": 0,
            "eval.every_seconds": float(study.eval_seconds),
            "eval.read_test": stage == "final",
        }
        start = start_for(task, spec.get("start", ""), _shape(spec["config"], ov))
        after: tuple[str, ...] = ()
        if start is not None:
            ov["sft.init_from"] = os.path.join(start.workdir, "adapter")
            after = (start.workdir,)
        return RunSpec(
            stage,
            task,
            name,
            int(seed),
            spec["config"],
            ov,
            os.path.join(study.out, task, name, f"seed{seed}"),
            after,
            arm=arm,
        )

    sweeps: list[list[RunSpec]] = []
    for arm, spec in study.arms.items():
        sweep = _plain(spec.get("sweep"))
        if not sweep:
            continue
        center = center_values(study, arm)
        base = {k: v for f, val in center.items() for k, v in factor_overrides(f, val).items()}
        i = 0
        arm_runs: list[RunSpec] = []
        sweeps.append(arm_runs)
        arm_runs.append(
            dataclasses.replace(
                loop_run(
                    "sweep",
                    sweep_task,
                    arm,
                    f"sweep_{arm}_{i}",
                    study.sweep_seed,
                    base,
                    study.sweep_budget,
                ),
                factor="",
            )
        )
        # The registered grid, then its extensions ("extend", outside the grid by `_check_extend`,
        # so never the center): appended last, the recorded runs keep their names (indices).
        points = [(f, v, False) for f, vals in sweep.items() for v in vals]
        points += [(f, v, True) for f, vals in _plain(spec.get("extend")).items() for v in vals]
        for factor, value, extension in points:
            if not extension and _same(value, center[factor]):
                continue
            i += 1
            ov = {**base, **factor_overrides(factor, value)}
            r = loop_run(
                "sweep",
                sweep_task,
                arm,
                f"sweep_{arm}_{i}",
                study.sweep_seed,
                ov,
                study.sweep_budget,
            )
            arm_runs.append(dataclasses.replace(r, factor=factor, value=value, extension=extension))
    # Round-robin over arms: a study cut short has every arm's sweep equally advanced (equal
    # effort at any point), and side-by-side runs are of different arms (a full-parameter run
    # beside an ESSA one, not beside another full-parameter one: memory).
    for k in range(max((len(r) for r in sweeps), default=0)):
        runs.extend(r[k] for r in sweeps if k < len(r))
    # Seed-major order: the runs of one seed of every arm come first, so a study cut short has
    # every arm at its first seeds, and side-by-side runs are of different arms.
    all_seeds = sorted(
        {int(x) for spec in study.arms.values() for x in (spec.get("seeds") or study.seeds)}
    )
    for task in study.tasks:
        for seed in all_seeds:
            for arm, spec in study.arms.items():
                if spec.get("tasks") and task not in spec["tasks"]:
                    continue
                if seed not in (spec.get("seeds") or study.seeds):
                    continue
                sweep = _plain(spec.get("sweep"))
                if sweep and arm not in chosen:
                    continue
                extra = {
                    k: v
                    for f, val in (chosen.get(arm) or {}).items()
                    for k, v in factor_overrides(f, val).items()
                }
                runs.append(loop_run("final", task, arm, arm, seed, extra, study.budget))
    return list(starts.values()) + runs


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, default=list) == json.dumps(b, default=list)


def check_equal_effort(study: Any, runs: Sequence[RunSpec]) -> dict[str, int]:
    """Registered sweep runs per arm (arms with a sweep; extensions, which only bracket an edge
    choice, are counted by `extension_runs`); ValueError when `study.sweep_runs` is set and an arm
    has another number: unequal tuning effort is refused before anything runs."""
    counts: dict[str, int] = {}
    for r in runs:
        if r.stage == "sweep" and not r.extension:
            counts[r.arm] = counts.get(r.arm, 0) + 1
    want = int(study.sweep_runs)
    if want:
        bad = {a: n for a, n in counts.items() if n != want}
        if bad:
            raise ValueError(
                f"study {study.name}: sweep_runs = {want} per arm, but {bad} (equal tuning effort: "
                "give every swept arm the same number of sweep runs)"
            )
    return counts


def extension_runs(runs: Sequence[RunSpec]) -> dict[str, int]:
    """Extension sweep runs per arm ("extend"): reported beside the equal registered count."""
    counts: dict[str, int] = {}
    for r in runs:
        if r.stage == "sweep" and r.extension:
            counts[r.arm] = counts.get(r.arm, 0) + 1
    return counts
