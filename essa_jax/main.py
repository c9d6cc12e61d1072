"""Command line: `python -m essa_jax.main --config experiments/configs/<name>.py --workdir runs/<name>`.

Override any field with `--config.<field>=<value>` (e.g. `--config.essa.population_size=24`); an
unknown field is an error (the config is locked). The config is validated before the model is
loaded; a run resumes automatically from the latest complete checkpoint in `--workdir`
(`--resume` insists on one, `--noresume_auto` refuses to reuse a workdir that has one).
"""

from __future__ import annotations

import os
import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "Experiment config file (experiments/configs/*.py, a get_config() returning a ConfigDict).",
    lock_config=True,
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and results.")
_RESUME = flags.DEFINE_bool("resume", False, "Require a checkpoint in --workdir and resume it.")
_RESUME_AUTO = flags.DEFINE_bool(
    "resume_auto", True, "Resume when --workdir holds a checkpoint (else refuse to overwrite it)."
)
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from absl import logging

    from essa_jax.config import ConfigError, validate_config

    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # orbax logs every checkpoint step at INFO

    config = _CONFIG.value
    try:
        validate_config(config)  # fail in a second, before any weights are read
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from essa_jax.train import train_and_evaluate

    resume = True if _RESUME.value else (None if _RESUME_AUTO.value else False)
    train_and_evaluate(config, os.path.expanduser(_WORKDIR.value), resume=resume)
    return 0


def run() -> None:
    """Console-script entry point (`essa-jax`)."""
    app.run(main)


if __name__ == "__main__":
    run()
