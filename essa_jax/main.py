"""Command line of essa_jax.

    python -m essa_jax.main --config experiments/configs/<name>.py --workdir runs/<name>
    python -m essa_jax.main --config experiments/configs/<name>.py --print_config   # every field
    python -m essa_jax.main --config experiments/configs/<name>.py --dry_run        # validate only

`--help` lists the shipped configs and these flags; `--print_config` prints every field of the
config (after the overrides) with its value and the schema's comment (`essa_jax.config_fields`);
`--dry_run` (alias `--only_check_args`) runs the run's own `validate_config`, reading no weight,
and exits 0 when the config would run, 2 with the one-line error otherwise.

Override any field with `--config.<field>=<value>` (e.g. `--config.essa.population_size=24`); an
unknown field is an error (the config is locked). The config is validated before the model is
loaded; a run resumes automatically from the latest complete checkpoint in `--workdir`
(`--resume` insists on one, `--noresume_auto` refuses to reuse a workdir that has one), and
refuses a config that changes the run's meaning (`--allow_config_change` overrides;
essa_jax.workdir). One run per workdir (`<workdir>/run.lock`).

Exit status: 0 done; 2 a user's error (one line on stderr: a field, a model or data file, a
reward, the workdir, a full or read-only disk); 128 + the signal after SIGTERM (143) or SIGINT
(130): the run stopped at a step boundary with a checkpoint, or, past
`checkpoint.preempt_seconds` or on a second signal, without one (essa_jax.preemption); 1 a bug
(traceback).

Several processes (hosts): start the same command on each with `--coordinator_address=host:port
--num_processes=N --process_id=i` (or the JAX_* environment variables; locally
`experiments/launch_local.py -n N -- python -m essa_jax.main ...`). `--workdir` must be one shared
directory; process 0 writes the logs and results, every process takes part in checkpointing.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from typing import Any

from absl import app, flags
from ml_collections import config_flags

from essa_jax import distributed, hostmem, peers

# --coordinator_address / --num_processes / --process_id (else $JAX_COORDINATOR_ADDRESS,
# $JAX_NUM_PROCESSES, $JAX_PROCESS_ID): one command line for every process of a multi-host run.
distributed.define_flags()
if "coordinator" not in flags.FLAGS:
    flags.DEFINE_alias("coordinator", "coordinator_address")


def define_flags(
    flag_values: flags.FlagValues = flags.FLAGS, sys_argv: Sequence[str] | None = None
) -> dict[str, Any]:
    """Define the CLI flags on `flag_values`; returns their holders by name.

    `sys_argv` is where config_flags finds the `--config.<field>` overrides (default sys.argv).
    """
    return {
        "config": config_flags.DEFINE_config_file(
            "config",
            None,
            "Experiment config file (experiments/configs/*.py: get_config() -> ConfigDict).",
            flag_values=flag_values,
            lock_config=True,
            sys_argv=list(sys_argv) if sys_argv is not None else None,
        ),
        "workdir": flags.DEFINE_string(
            "workdir",
            None,
            "Directory for checkpoints, metrics and results.",
            flag_values=flag_values,
        ),
        "resume": flags.DEFINE_bool(
            "resume",
            False,
            "Require a checkpoint in --workdir and resume it.",
            flag_values=flag_values,
        ),
        "verbose_errors": flags.DEFINE_bool(
            "verbose_errors",
            False,
            "Show the traceback of an error in the config, checkpoint or data (default: one line).",
            flag_values=flag_values,
        ),
        "resume_auto": flags.DEFINE_bool(
            "resume_auto",
            True,
            "Resume when --workdir holds a checkpoint (else refuse to overwrite it).",
            flag_values=flag_values,
        ),
        "print_config": flags.DEFINE_bool(
            "print_config",
            False,
            "Print every config field (after the overrides) with its value and comment, and exit "
            "(with --dry_run: then validate). No --workdir needed.",
            flag_values=flag_values,
        ),
        "dry_run": flags.DEFINE_bool(
            "dry_run",
            False,
            "Validate the config as the run does (validate_config: no weight is read) and exit: "
            "0 if it would run, 2 with the error. No --workdir needed. --only_check_args = this.",
            flag_values=flag_values,
        ),
        "memory_check": flags.DEFINE_bool(
            "memory_check",
            True,
            "Before any weight is read, compile the run's programs ahead of time for this "
            "machine's devices (essa_jax.plan.check_run_fits: host memory on a CPU) and refuse a "
            "run that cannot fit, in one line. --nomemory_check skips it (it costs a compile of "
            "each program).",
            flag_values=flag_values,
        ),
        "compile_cache": flags.DEFINE_string(
            "compile_cache",
            "auto",
            "JAX's persistent compilation cache, so that a resumed or repeated run skips most "
            "compilation: auto ($JAX_COMPILATION_CACHE_DIR, else $ESSA_JAX_COMPILE_CACHE, else "
            "~/.cache/essa_jax/jax_compile), off, or a folder; safe to share between runs "
            "(essa_jax.compile_cache).",
            flag_values=flag_values,
        ),
        "allow_config_change": flags.DEFINE_bool(
            "allow_config_change",
            False,
            "Resume even when a field that changes the run's meaning (model, method, task, "
            "reward, seeds, population, rank, strategy, ...) differs from --workdir's config.json; "
            "the change is recorded in config_changes.jsonl (essa_jax.workdir.MAY_CHANGE lists "
            "the fields that may change without it).",
            flag_values=flag_values,
        ),
    }


def _flag(holders: dict[str, Any], name: str) -> bool:
    """The value of boolean flag `name` of `holders`; False when it is not defined there."""
    return name in holders and bool(holders[name].value)


def run_from_flags(holders: dict[str, Any]) -> int:
    """Validate the config (exit status 2 on a bad field), then train and evaluate."""
    from essa_jax.config import ConfigError
    from essa_jax.train.methods import validate_config

    config, workdir = holders["config"].value, holders["workdir"].value
    dry_run = _flag(holders, "dry_run")
    if config is None or not (workdir or dry_run):
        print("error: --config and --workdir are required (see --help)", file=sys.stderr)
        return 2
    from essa_jax.checkpointing import WorkdirError
    from essa_jax.data.loading import MalformedRowError
    from essa_jax.es import SearchError
    from essa_jax.models import CheckpointError, UnsupportedModelError
    from essa_jax.rewards import RewardFunctionError

    # A user's input that cannot run (a field, a checkpoint, a data row, a reward function, a
    # workdir): one line, exit 2. The traceback only with --verbose_errors, for reporting a bug.
    user_errors = (
        ConfigError,
        CheckpointError,
        UnsupportedModelError,
        MalformedRowError,
        RewardFunctionError,
        SearchError,
        WorkdirError,
    )
    from essa_jax.plan import PlanError

    user_errors += (PlanError,)
    resume = True if holders["resume"].value else (None if holders["resume_auto"].value else False)
    try:
        validate_config(config)  # fail in a second, before any weights are read
        if dry_run:
            from essa_jax.train.pipeline import check_task_data

            # What the run would refuse before its weights: the task's data and prompt lengths.
            data = check_task_data(config)
        memory = check_memory(config) if _memory_check(holders) else "memory not checked"
        if dry_run:
            print(
                f"config OK: method {config.method!r}, model {config.model.path!r}; {data}; "
                f"{memory} (nothing run)"
            )
            return 0
        print(memory, flush=True)
        from essa_jax.train import train_and_evaluate

        train_and_evaluate(
            config,
            os.path.expanduser(workdir),
            resume=resume,
            allow_config_change=_flag(holders, "allow_config_change"),
        )
    except user_errors as e:
        if _flag(holders, "verbose_errors"):
            raise
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except BaseException as e:  # noqa: BLE001 - anything else is re-raised unless it is below
        return _stopped_or_os_error(e, holders)
    return 0


def _memory_check(holders: dict[str, Any]) -> bool:
    """Whether `--memory_check` is on (its default, True, when the flag is not defined)."""
    return "memory_check" not in holders or bool(holders["memory_check"].value)


def check_memory(config) -> str:
    """The memory plan of `config`'s run on this machine (`plan.check_run_fits`), as the line a
    run prints; raises `plan.PlanError` (one line: the program that does not fit, its bytes and
    the machine's) when a program cannot fit. Runs after `validate_config` and before any
    weight is read, in `--dry_run` too. With several processes it is left out, with a line
    saying so: the plan's programs would be compiled on devices other processes own."""
    import jax

    from essa_jax.plan import check_run_fits

    if jax.process_count() > 1:
        return (
            "memory not checked with several processes (python -m essa_jax.plan --devices N "
            "--device_memory_gb G plans the run's programs)"
        )
    from essa_jax.config import UNSET, peek_or_none

    path = config.model.path
    if not config.model.name and (not path or UNSET in path or peek_or_none(path) is None):
        # No shape without the weights (a hub id, a folder without config.json): the run's own
        # load will say what is wrong with the path; the plan needs --config.model.name.
        return (
            "memory not checked: the model's shape cannot be read without its weights "
            "(--config.model.name=<shape> lets the plan check it)"
        )
    plans = check_run_fits(config)
    peak = max(plans, key=lambda p: p.per_device_bytes)
    return (
        f"memory OK: {len(plans)} programs fit {plans[0].target}; largest {peak.program} "
        f"{peak.per_device_bytes / 1e9:.2f} GB per device"
    )


def _stopped_or_os_error(e: BaseException, holders: dict[str, Any]) -> int:
    """The exit status and one stderr line of a run stopped by a signal (`Preempted`: 128 + the
    signal, after its checkpoint; Ctrl-C before the run's handler is installed: 130) or ended by
    an OSError a user fixes (no space, read-only, not writable: 2, naming the path and the cause,
    even when orbax or a library wrapped it); re-raises anything else (a bug keeps its
    traceback)."""
    from essa_jax.preemption import Preempted
    from essa_jax.workdir import find_os_error, os_error_line

    if isinstance(e, Preempted):
        print(f"stopped: {e}", file=sys.stderr)
        return e.exit_status
    if isinstance(e, KeyboardInterrupt):
        print("stopped: SIGINT received before the run started; nothing written", file=sys.stderr)
        return 130
    os_error = find_os_error(e) if isinstance(e, Exception) else None
    if os_error is None or _flag(holders, "verbose_errors"):
        # With several processes, an error from a collective whose peer died: the peer watch
        # ends the process with its one line (essa_jax.peers); otherwise this is a bug.
        if isinstance(e, Exception) and not _flag(holders, "verbose_errors"):
            peers.await_loss()
        raise e
    print(f"error: {os_error_line(os_error, holders['workdir'].value)}", file=sys.stderr)
    # Orbax's writer threads still hold the failed write: at interpreter exit they print dozens of
    # tracebacks; `main` leaves without running them (nothing is left to write), on every process.
    holders["_exit_now"] = True
    return 2


_HOLDERS: dict[str, Any] = {}


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _flag(_HOLDERS, "print_config"):
        config = _HOLDERS["config"].value
        if config is None:
            print("error: --print_config needs --config (see --help)", file=sys.stderr)
            return 2
        from essa_jax.config_fields import describe_config

        print(describe_config(config), flush=True)
        if not _flag(_HOLDERS, "dry_run"):
            return 0
    # Several processes: this command supervises its own re-run (essa_jax.peers), so that a
    # lost peer ends every survivor in one line, also when JAX's runtime aborts the process.
    coordinator, num, pid = distributed.requested_settings()
    if peers.needs_supervisor(num):
        return peers.supervise(pid or 0, num, coordinator)
    # Before validate_config: jax.device_count() there creates the backend, after which this
    # process could no longer join a multi-process run.
    distributed.skip_absent_tpu()
    distributed.initialize_from_flags()
    if "peer_timeout_s" in flags.FLAGS:
        peers.start_watch(float(flags.FLAGS["peer_timeout_s"].value))
    if "compile_cache" in _HOLDERS:
        from essa_jax import compile_cache

        try:
            compile_cache.enable(_HOLDERS["compile_cache"].value)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    from absl import logging

    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # orbax logs every checkpoint step at INFO
    rc = run_from_flags(_HOLDERS)
    # After a user's error orbax's reader / writer threads may still print tracebacks at
    # interpreter exit (a failed restore or write): its one line is all there is to say. With
    # several processes the barrier below still runs, except after an OS error.
    import jax

    if _HOLDERS.pop("_exit_now", False) or (rc == 2 and jax.process_count() == 1):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    # A barrier: no process leaves while a peer still needs it. Not reached on an exception,
    # where waiting for the peers would only delay the failure. Marked done first: the peers
    # still writing results must not count this process lost while it waits.
    peers.finish_watch(rc)
    distributed.shutdown()
    return rc


# What a config file's get_config() must return, for the errors that say it did not.
GET_CONFIG_CONTRACT = (
    "get_config() must return an ml_collections.ConfigDict (e.g. essa_jax.config.base_config() "
    "with fields set; experiments/configs/*.py)"
)


def config_file_problem(path: str) -> str | None:
    """One line saying why config file `path` cannot be read (no such file, a folder, not
    readable), or None. Checked before the flags are parsed: ml_collections would defer a missing
    file to its first use, as a traceback, and report an unreadable one in several lines."""
    if os.path.isdir(path):
        return f"--config {path}: a folder, not a config file (experiments/configs/*.py)"
    if not os.path.isfile(path):
        return f"--config {path}: no such file (experiments/configs/*.py)"
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        return f"--config {path}: cannot be read ({e.strerror or e})"
    return None


def config_load_error(path: str, e: BaseException) -> str | None:
    """One line naming config file `path` and what went wrong, when exception `e` (raised while
    the flags were parsed) came from the file itself: a syntax error in it, no get_config, or an
    exception raised while it ran (its frames are in the traceback). None when `e` is about
    something else (an override of an unknown field, a value of the wrong type)."""
    target = os.path.abspath(path)
    chain, seen = [], set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        chain.append(e)
        e = e.__cause__ or e.__context__
    for err in chain:
        if isinstance(err, SyntaxError) and os.path.abspath(err.filename or "") == target:
            return f"--config {path}: line {err.lineno}: {err.msg}; {GET_CONFIG_CONTRACT}"
        if isinstance(err, AttributeError) and "get_config" in str(err):
            return f"--config {path}: the file defines no get_config(); {GET_CONFIG_CONTRACT}"
        import traceback

        frames = traceback.extract_tb(err.__traceback__)
        inside = [f for f in frames if os.path.abspath(f.filename) == target]
        if inside:
            what = " ".join(f"{type(err).__name__}: {err}".split())
            return (
                f"--config {path}: line {inside[-1].lineno} raised {what} while the config was "
                f"loaded; {GET_CONFIG_CONTRACT}"
            )
    return None


def config_value_problem(path: str | None, value: Any) -> str | None:
    """One line when the config that `path`'s get_config() returned is not a ConfigDict (a plain
    dict, None), or None: a dict would fail later as an AttributeError deep in the run, None as
    a request for --config."""
    import ml_collections

    if path is None or isinstance(value, ml_collections.ConfigDict):
        return None
    what = "None" if value is None else f"a {type(value).__name__}"
    return f"--config {path}: get_config() returned {what}; {GET_CONFIG_CONTRACT}"


class _NoneConfigWarning:
    """A logging filter dropping ml_collections' warning that get_config() returned None:
    `parse_flags` says so itself, in its one error line."""

    def filter(self, record: Any) -> bool:
        return "returned None" not in record.getMessage()


@contextlib.contextmanager
def quiet_none_config_warning():
    """`_NoneConfigWarning` on absl's logger while the flags are parsed."""
    import logging

    logger, flt = logging.getLogger("absl"), _NoneConfigWarning()
    logger.addFilter(flt)
    try:
        yield
    finally:
        logger.removeFilter(flt)


def parse_config_flags(argv: Sequence[str], flag_values: flags.FlagValues) -> list[str] | str:
    """Parse `argv` into `flag_values` (holding a `--config` file flag): the remaining arguments,
    or one line (without "error: ") saying what is wrong with the config file or the command
    line. The file's folder is on sys.path meanwhile, so it imports its neighbours (a user's
    strategy / weighting / method module). Shared by `python -m essa_jax.main` and
    `python -m essa_jax.plan`."""
    from essa_jax.config import config_dir_on_path

    path = config_file_path(argv)
    if path is not None:
        problem = config_file_problem(path)
        if problem:
            return problem
    try:
        with contextlib.nullcontext() if path is None else config_dir_on_path(path):
            with quiet_none_config_warning():
                rest = flag_values(list(argv))
    except Exception as e:  # ml_collections raises AttributeError / KeyError for unknown fields
        return (
            (path is not None and config_load_error(path, e))
            or unknown_override(argv)
            or " ".join(str(e).split())
        )
    if "config" in flag_values:
        problem = config_value_problem(path, flag_values["config"].value)
        if problem:
            return problem
    return rest


def config_file_path(argv: Sequence[str]) -> str | None:
    """The config file of `--config=FILE[:args]` / `--config FILE` in argv (None if absent)."""
    path = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
    if path is None and "--config" in argv[:-1]:
        path = argv[list(argv).index("--config") + 1]
    return None if path is None else path.split(":", 1)[0]


def unknown_override(argv: Sequence[str]) -> str | None:
    """The first `--config.<path>=...` of `argv` that names no field of the config file, as one
    line naming it, the nearest valid names and where the fields are listed; None if all exist."""
    import difflib

    from essa_jax.config import load_config_file

    path = config_file_path(argv)
    if path is None:
        return None
    try:
        config = load_config_file(path)
    except Exception:  # a broken config file: absl's own message says more
        return None
    for arg in argv:
        if not arg.startswith("--config."):
            continue
        field = arg[len("--config.") :].split("=", 1)[0]
        node, walked = config, []
        for part in field.split("."):
            keys = list(node.keys()) if hasattr(node, "keys") else []
            if part not in keys:
                where = "config" + "".join("." + w for w in walked)
                near = difflib.get_close_matches(part, keys, n=3, cutoff=0.5)
                hint = f"did you mean {' or '.join(map(repr, near))}? " if near else ""
                return (
                    f"--config.{field}: {where} has no field {part!r}; {hint}valid fields of "
                    f"{where}: {', '.join(sorted(keys))} (all fields: essa_jax/config.py "
                    "base_config)"
                )
            node = node[part]
            walked.append(part)
    return None


CONFIG_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments", "configs"
)
HELP_ARGS = ("--help", "-h", "-?", "--helpshort", "--helpfull")


def shipped_configs(directory: str = CONFIG_DIR) -> list[tuple[str, str]]:
    """(path, first line of its docstring) of every config file in `directory`, by name; empty
    when the package runs without its source tree."""
    import ast

    if not os.path.isdir(directory):
        return []
    out = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".py") and not name.startswith("_"):
            path = os.path.join(directory, name)
            with open(path) as f:
                doc = ast.get_docstring(ast.parse(f.read())) or ""
            out.append((os.path.relpath(path), doc.strip().split("\n")[0]))
    return out


def usage(holders: dict[str, Any], flag_values: flags.FlagValues = flags.FLAGS) -> str:
    """What `--help` prints: the commands, the shipped configs with their purpose, the flags."""
    lines = [
        "essa_jax: align LLMs with ESSA (evolution strategies on LoRA singular values) or the "
        "GRPO family.",
        "",
        "Commands:",
        "  python -m essa_jax.main --config CONFIG --workdir DIR [--config.<field>=VALUE ...]",
        "      train and evaluate (essa-jax is the same command; `make run` runs the default)",
        "  python -m essa_jax.plan --config CONFIG [--devices N --device_memory_gb G | --target T]",
        "      ahead-of-time plan: per-device bytes and estimated time of every program, no run",
        "",
        "Shipped configs (experiments/configs):",
    ]
    configs = shipped_configs()
    width = max((len(p) for p, _ in configs), default=0)
    lines += [f"  {p:<{width}}  {doc}" for p, doc in configs] or ["  (no source tree here)"]
    lines += ["", "Flags:"]
    names = list(holders) + [
        "coordinator_address", "num_processes", "process_id",
    ]  # fmt: skip
    for name in names:
        if name in flag_values:
            fl = flag_values[name]
            default = "" if fl.default is None else f" (default: {fl.default_as_str})"
            lines.append(f"  --{name}: {' '.join(fl.help.split())}{default}")
    lines += [
        "",
        "Every config field: --print_config (values with comments); essa_jax/config.py "
        "base_config is the schema. Overrides: --config.<section>.<field>=VALUE.",
    ]
    return "\n".join(lines)


def parse_flags(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS) -> list[str]:
    """absl's flag parsing, with a user's mistake on the command line (an unknown config field, a
    value of the wrong type, a missing config file) ending in one line on stderr and exit 2.
    `--help` prints `usage` and exits 0; `--only_check_args` is `--dry_run` (absl would exit 0
    without looking at the config)."""
    if any(a in HELP_ARGS for a in argv[1:]):
        print(usage(_HOLDERS, flag_values))
        sys.exit(0)
    rest = parse_config_flags(argv, flag_values)
    if isinstance(rest, str):
        print(f"error: {rest}", file=sys.stderr)
        sys.exit(2)
    problem = distributed.flags_problem(flag_values)
    if problem:
        # A partial multi-process command line, seen before anything runs (--dry_run too).
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
    if "only_check_args" in flag_values and flag_values["only_check_args"].value:
        flag_values["only_check_args"].value = False
        flag_values["dry_run"].value = True
    return rest


def run() -> None:
    """Console-script entry point (`essa-jax`)."""
    # Before anything allocates: restart with glibc keeping freed memory (essa_jax.hostmem says
    # why: XLA's CPU buffers were page-faulted back in on every call).
    hostmem.reexec_with_retained_malloc()
    _HOLDERS.update(define_flags())
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    run()
