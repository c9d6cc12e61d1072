"""Multi-process (multi-host) JAX: start-up, process identity, shutdown. Nothing else.

What travels between processes, and how, is decided by the programs that use the processes'
devices: ESSA's population step (`essa_jax.population`, docs/ARCHITECTURE.md "Several processes")
runs on one mesh over every process's devices (`essa_jax.mesh.make_mesh`): every process holds the
same strategy state and PRNG key, regenerates the whole population, generates and scores only the
rows on its own devices, and all-gathers the per-row rewards (a few floats per rollout, ESSA
arXiv 2507.04453, Sec. 3 "Distributed implementation"), then applies the identical update.

This module wraps `jax.distributed.initialize` (multi-controller JAX; gloo collectives on CPU, so
several processes on one machine over 127.0.0.1 behave like hosts of a cluster) with:

- the standard environment variables as fall-backs: ``JAX_COORDINATOR_ADDRESS``,
  ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID`` (and ``JAX_LOCAL_DEVICE_IDS``, read by JAX itself);
  cluster auto-detection (SLURM, Open MPI, Cloud TPU) still applies when none of them is set and
  ``num_processes`` > 1 is not given;
- bounded waiting: a process whose peers do not all connect within ``timeout_s`` raises
  `DistributedInitError` naming the coordinator, the process and the count it waited for, instead of
  hanging; a peer that stops heart-beating for ``heartbeat_timeout_s`` makes the coordination
  service abort the survivors (JAX's own behaviour, here with a short default);
- `is_main_process()` for process-0-only side effects (checkpoints, logs, result files).

Call `initialize(...)` (or `initialize_from_flags()`) before any other JAX call in the process.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

logger = logging.getLogger(__name__)

ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"

DEFAULT_TIMEOUT_S = 120
DEFAULT_HEARTBEAT_TIMEOUT_S = 60
DEFAULT_SHUTDOWN_TIMEOUT_S = 60


# Exit status of a process whose peers did not all connect within timeout_s (EX_TEMPFAIL: retry).
INIT_TIMEOUT_EXIT_CODE = 75
_JAX_TIMEOUT_MARGIN_S = 15


class DistributedInitError(RuntimeError):
    """The processes of a multi-process run could not all reach the coordinator in time."""


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
    """Where this process sits in the run (after `initialize`)."""

    process_id: int
    num_processes: int
    coordinator_address: str | None
    local_device_count: int
    global_device_count: int
    backend: str

    @property
    def is_main(self) -> bool:
        return self.process_id == 0


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} must be an integer") from None


_ADDRESS_RE = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.\-]+):(\d{1,5})$")


def _check_address(address: str) -> str:
    m = _ADDRESS_RE.match(address)
    if m is None or not 0 < int(m.group(2)) < 65536:
        raise ValueError(
            f"coordinator_address={address!r} is invalid: expected 'host:port' with a port in "
            "1..65535 (e.g. '127.0.0.1:12345' or '[::1]:12345')"
        )
    return address


def _backend_started() -> bool:
    from jax._src import xla_bridge

    return bool(xla_bridge.backends_are_initialized())


# Signs of TPU hardware on this host: its device files, or the variables a Cloud TPU VM sets.
_TPU_DEVICE_GLOBS = ("/dev/accel*", "/dev/vfio/[0-9]*")
_TPU_ENV = ("TPU_ACCELERATOR_TYPE", "TPU_NAME", "TPU_WORKER_HOSTNAMES", "TPU_SKIP_MDS_QUERY")


def skip_absent_tpu() -> str | None:
    """Keep JAX off libtpu on a host without TPUs; returns the platforms set, or None if unchanged.

    The `libtpu` wheel (the `tpu` and test extras: the ahead-of-time plan compiles for TPU targets
    on any machine, docs/ARCHITECTURE.md "Planning memory") makes every JAX start-up probe for TPU
    hardware, which on a CPU or GPU host prints a page of warnings before falling back. When
    libtpu is installed, no TPU is visible and the user has not chosen (`JAX_PLATFORMS` unset),
    the run's platforms become "cuda,cpu" (a CUDA plugin installed) or "cpu". TPU topologies for
    ahead-of-time compilation (`jax.experimental.topologies`) work either way. Call before the
    first JAX computation.
    """
    import glob
    import importlib.util

    if os.environ.get("JAX_PLATFORMS") or importlib.util.find_spec("libtpu") is None:
        return None
    if any(os.environ.get(v) for v in _TPU_ENV) or any(glob.glob(g) for g in _TPU_DEVICE_GLOBS):
        return None
    cuda = any(importlib.util.find_spec(f"jax_cuda{v}_plugin") is not None for v in ("12", "13"))
    platforms = "cuda,cpu" if cuda else "cpu"
    import jax

    jax.config.update("jax_platforms", platforms)
    return platforms


def resolve_settings(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> tuple[str | None, int | None, int | None]:
    """Arguments, else the JAX_* environment variables; validated. None = left to auto-detect."""
    coordinator_address = coordinator_address or os.environ.get(ENV_COORDINATOR) or None
    if num_processes is None:
        num_processes = _env_int(ENV_NUM_PROCESSES)
    if process_id is None:
        process_id = _env_int(ENV_PROCESS_ID)
    if num_processes is not None and (isinstance(num_processes, bool) or num_processes < 1):
        raise ValueError(f"num_processes={num_processes!r} is invalid: valid values are >= 1")
    if process_id is not None and num_processes is not None:
        if not 0 <= process_id < num_processes:
            raise ValueError(
                f"process_id={process_id!r} is invalid: valid values are 0..{num_processes - 1} "
                f"(num_processes={num_processes})"
            )
    if coordinator_address is not None:
        _check_address(coordinator_address)
    if num_processes is not None and num_processes > 1:
        missing = [
            n
            for n, v in (("coordinator_address", coordinator_address), ("process_id", process_id))
            if v is None
        ]
        if missing:
            raise ValueError(
                f"num_processes={num_processes} needs {' and '.join(missing)} too (arguments, "
                f"or the environment variables {ENV_COORDINATOR} / {ENV_PROCESS_ID})"
            )
    return coordinator_address, num_processes, process_id


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    local_device_ids: int | Sequence[int] | None = None,
    timeout_s: int = DEFAULT_TIMEOUT_S,
    heartbeat_timeout_s: int = DEFAULT_HEARTBEAT_TIMEOUT_S,
    shutdown_timeout_s: int = DEFAULT_SHUTDOWN_TIMEOUT_S,
    cpu_collectives: str = "gloo",
    auto_detect: bool = False,
) -> ProcessInfo:
    """Join (or, as process 0, host) a multi-process JAX run; a no-op for a single process.

    Args:
      coordinator_address: "host:port" of process 0's coordination service; default
        ``$JAX_COORDINATOR_ADDRESS``.
      num_processes: processes in the run; default ``$JAX_NUM_PROCESSES``; None or 1 with no
        coordinator and ``auto_detect=False`` = single process (nothing to initialise).
      process_id: this process's rank in 0..num_processes-1; default ``$JAX_PROCESS_ID``.
      local_device_ids: accelerator ids this process owns (default: all visible).
      timeout_s: how long to wait for every process to connect before failing.
      heartbeat_timeout_s: a peer silent this long is declared dead and the run aborted.
      shutdown_timeout_s: how long `shutdown` waits for the others at the final barrier.
      cpu_collectives: cross-process collectives on CPU, "gloo" (default) or "mpi".
      auto_detect: let JAX detect the cluster (SLURM / Open MPI / Cloud TPU) when arguments and
        environment leave something unset.

    Returns:
      `ProcessInfo` of this process.

    Raises:
      DistributedInitError: the peers did not all connect within ``timeout_s``.
      ValueError: inconsistent arguments (the message names the field and the valid values).
      RuntimeError: called after JAX already created its backend in this process.
    """
    import jax

    for name, v in (
        ("timeout_s", timeout_s),
        ("heartbeat_timeout_s", heartbeat_timeout_s),
        ("shutdown_timeout_s", shutdown_timeout_s),
    ):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r} is invalid: valid values are integers >= 1 (seconds)")
    if cpu_collectives not in ("gloo", "mpi"):
        raise ValueError(
            f"cpu_collectives={cpu_collectives!r} is invalid: valid values are gloo, mpi"
        )
    coordinator_address, num_processes, process_id = resolve_settings(
        coordinator_address, num_processes, process_id
    )

    if jax.distributed.is_initialized():
        logger.info("jax.distributed is already initialised; reusing it")
        return process_info()
    single = (num_processes in (None, 1)) and coordinator_address is None and not auto_detect
    if single or num_processes == 1:
        return process_info()
    if not auto_detect and (num_processes is None or process_id is None):
        raise ValueError(
            f"coordinator_address={coordinator_address!r} is set but "
            f"num_processes={num_processes!r} / process_id={process_id!r} are not: "
            f"give both (arguments or {ENV_NUM_PROCESSES} / "
            f"{ENV_PROCESS_ID}), or pass auto_detect=True on a SLURM / Open MPI / TPU cluster"
        )
    if _backend_started():
        raise RuntimeError(
            "essa_jax.distributed.initialize must run before any JAX computation in this process "
            "(a backend already exists, so it cannot join a multi-process run); call it first "
            "thing in main()"
        )

    # Gloo is JAX's default CPU collective in 0.10; set it explicitly so an older default ("none")
    # or a user's stray flag cannot leave cross-process CPU collectives unimplemented.
    jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
    t0 = time.monotonic()
    message = (
        f"process {process_id} of {num_processes} could not join the run at coordinator "
        f"{coordinator_address} within {timeout_s} s (timeout_s): not every process connected. "
        "Check that all processes were started with the same coordinator address and "
        "num_processes, with distinct process ids, and that process 0 is reachable."
    )
    # When the peers do not all register, JAX's coordination client aborts the whole process from
    # C++ (SIGABRT, a DEADLINE_EXCEEDED log line, some seconds after its own timeout), which Python
    # cannot catch. A watchdog that fires first turns that into a clear message and a distinct exit
    # code at exactly timeout_s; JAX's own deadline is set a little later as the back-stop.
    joined = threading.Event()
    watchdog = threading.Thread(
        target=_init_watchdog, args=(joined, timeout_s, message), daemon=True
    )
    watchdog.start()
    try:
        jax.distributed.initialize(
            coordinator_address=coordinator_address,
            num_processes=num_processes,
            process_id=process_id,
            local_device_ids=local_device_ids,
            cluster_detection_method=None if auto_detect else "deactivate",
            initialization_timeout=timeout_s + _JAX_TIMEOUT_MARGIN_S,
            heartbeat_timeout_seconds=heartbeat_timeout_s,
            shutdown_timeout_seconds=shutdown_timeout_s,
        )
    except Exception as e:  # a status JAX does raise (e.g. a refused or malformed address)
        first = str(e).splitlines()[0] if str(e) else ""
        raise DistributedInitError(
            f"{message} Underlying error: {type(e).__name__}: {first}"
        ) from e
    finally:
        joined.set()
    info = process_info()
    logger.info(
        "joined multi-process run: process %d/%d, %d local / %d global devices (%.1f s)",
        info.process_id,
        info.num_processes,
        info.local_device_count,
        info.global_device_count,
        time.monotonic() - t0,
    )
    return info


def _init_watchdog(joined: threading.Event, timeout_s: float, message: str) -> None:
    if joined.wait(timeout_s):
        return
    sys.stderr.write(f"essa_jax.distributed: DistributedInitError: {message}\n")
    sys.stderr.flush()
    logging.shutdown()
    os._exit(INIT_TIMEOUT_EXIT_CODE)


def shutdown() -> None:
    """Leave the run (a barrier with the other processes); safe to call when not initialised."""
    import jax

    if jax.distributed.is_initialized():
        jax.distributed.shutdown()


def process_info() -> ProcessInfo:
    """This process's rank, the process count and device counts (creates the backend)."""
    import jax
    from jax._src import distributed as _dist

    return ProcessInfo(
        process_id=jax.process_index(),
        num_processes=jax.process_count(),
        coordinator_address=_dist.global_state.coordinator_address,
        local_device_count=jax.local_device_count(),
        global_device_count=jax.device_count(),
        backend=jax.default_backend(),
    )


def is_main_process() -> bool:
    """True on process 0: the one that writes checkpoints, logs and result files."""
    import jax

    return jax.process_index() == 0


# ---------------------------------------------------------------------------------------------
# absl flags: the CLI's side of initialisation


_FLAG_NAMES = (
    "coordinator_address",
    "num_processes",
    "process_id",
    "distributed_timeout_s",
    "heartbeat_timeout_s",
    "peer_timeout_s",
)


def define_flags(flag_values: Any = None) -> None:
    """Register --coordinator_address, --num_processes, --process_id, --distributed_timeout_s,
    --heartbeat_timeout_s on absl's FLAGS (idempotent; call at import time of the main module)."""
    from absl import flags

    fv = flags.FLAGS if flag_values is None else flag_values
    if "coordinator_address" in fv:
        return
    flags.DEFINE_string(
        "coordinator_address",
        None,
        f"host:port of process 0 (multi-process runs); default ${ENV_COORDINATOR}",
        flag_values=fv,
    )
    flags.DEFINE_integer(
        "num_processes", None, f"processes in the run; default ${ENV_NUM_PROCESSES}", flag_values=fv
    )
    flags.DEFINE_integer(
        "process_id", None, f"this process's rank; default ${ENV_PROCESS_ID}", flag_values=fv
    )
    flags.DEFINE_integer(
        "distributed_timeout_s",
        DEFAULT_TIMEOUT_S,
        "seconds to wait for every process to connect before failing",
        flag_values=fv,
    )
    flags.DEFINE_integer(
        "heartbeat_timeout_s",
        DEFAULT_HEARTBEAT_TIMEOUT_S,
        "seconds of silence after which a peer process is declared dead",
        flag_values=fv,
    )
    flags.DEFINE_float(
        "peer_timeout_s",
        30.0,
        "seconds without a peer's heartbeat (essa_jax.peers) after which every survivor stops "
        "in one line naming it (exit status 69); below --heartbeat_timeout_s, so it comes first",
        flag_values=fv,
    )


_SETTING_FLAGS = (
    ("coordinator_address", ENV_COORDINATOR),
    ("num_processes", ENV_NUM_PROCESSES),
    ("process_id", ENV_PROCESS_ID),
)


def settings_problem(
    coordinator_address: str | None, num_processes: int | None, process_id: int | None
) -> str | None:
    """One line naming what a partial multi-process setting lacks, or None when it is complete
    (all three, or num_processes > 1 with the other two) or absent (one process).

    A coordinator address or a process id alone would otherwise start a single-process run on
    this machine (or fail deep in `initialize`), each process training alone: silently wrong.
    The values are the flags' or, where a flag is not given, the environment's (`resolve_settings`
    reads them the same way)."""
    given = {
        "coordinator_address": coordinator_address,
        "num_processes": num_processes,
        "process_id": process_id,
    }
    if all(v is None for v in given.values()) or (num_processes == 1 and process_id in (None, 0)):
        return None
    try:
        resolve_settings(coordinator_address, num_processes, process_id)
    except ValueError as e:
        return (
            f"{e}; every process of a multi-process run needs --coordinator_address, "
            "--num_processes and --process_id"
        )
    missing = [n for n, v in given.items() if v is None]
    if not missing:
        return None
    env = dict(_SETTING_FLAGS)
    have = " and ".join(f"--{n}" for n, v in given.items() if v is not None)
    return (
        f"{have} {'is' if len(given) - len(missing) == 1 else 'are'} set but "
        f"{' and '.join(f'--{n}' for n in missing)} "
        f"{'is' if len(missing) == 1 else 'are'} not (nor "
        f"{' / '.join('$' + env[n] for n in missing)}): a multi-process run needs all three on "
        "every process (e.g. --coordinator_address=host:1234 --num_processes=2 --process_id=0); "
        "a single-process run needs none"
    )


def requested_settings(flag_values: Any = None) -> tuple[str | None, int | None, int | None]:
    """(coordinator address, process count, process id) the command line asks for (flags, else
    the JAX_* environment); Nones when the flags were never defined and the environment is
    silent. Read before JAX starts: the CLI decides from it whether to supervise the run."""
    from absl import flags

    fv = flags.FLAGS if flag_values is None else flag_values
    if "coordinator_address" not in fv:
        return (
            os.environ.get(ENV_COORDINATOR) or None,
            _env_int(ENV_NUM_PROCESSES),
            _env_int(ENV_PROCESS_ID),
        )
    # Values read from the holders: an unparsed FlagValues (a test calling main) has defaults.
    num, pid, coord = (fv[n].value for n in ("num_processes", "process_id", "coordinator_address"))
    num = num if num is not None else _env_int(ENV_NUM_PROCESSES)
    pid = pid if pid is not None else _env_int(ENV_PROCESS_ID)
    return coord or os.environ.get(ENV_COORDINATOR) or None, num, pid


def flags_problem(flag_values: Any = None) -> str | None:
    """`settings_problem` of the command line's flags of `define_flags` (the JAX_* environment
    variables where a flag is not given); None when the flags were never defined. The CLI calls
    it right after parsing, before `--dry_run` or anything else runs."""
    from absl import flags

    fv = flags.FLAGS if flag_values is None else flag_values
    if "coordinator_address" not in fv:
        return None
    try:
        num = fv.num_processes if fv.num_processes is not None else _env_int(ENV_NUM_PROCESSES)
        pid = fv.process_id if fv.process_id is not None else _env_int(ENV_PROCESS_ID)
    except ValueError as e:
        return str(e)
    coord = fv.coordinator_address or os.environ.get(ENV_COORDINATOR) or None
    return settings_problem(coord, num, pid)


def initialize_from_flags(flag_values: Any = None) -> ProcessInfo:
    """`initialize` with the values of the flags of `define_flags` (env variables as fall-back).

    Works when the flags were never defined too (then only the environment is read).
    """
    from absl import flags

    fv = flags.FLAGS if flag_values is None else flag_values
    kw: dict[str, Any] = {}
    if "coordinator_address" in fv:
        kw = dict(
            coordinator_address=fv.coordinator_address,
            num_processes=fv.num_processes,
            process_id=fv.process_id,
            timeout_s=fv.distributed_timeout_s,
            heartbeat_timeout_s=fv.heartbeat_timeout_s,
        )
    return initialize(**kw)
