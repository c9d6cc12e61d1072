"""Start N local processes of a multi-process JAX run on 127.0.0.1 (gloo on CPU), for testing.

    python experiments/launch_local.py -n 2 [--devices-per-process 4] [--timeout 600] -- \
        python -m essa_jax.main --config ... --workdir runs/x

Each process gets ``JAX_COORDINATOR_ADDRESS=127.0.0.1:<free port>``, ``JAX_NUM_PROCESSES=N``,
``JAX_PROCESS_ID=i`` (read by `essa_jax.distributed.initialize`) and, with --devices-per-process,
``XLA_FLAGS=--xla_force_host_platform_device_count=<k>``. The literal ``{process_id}`` in the
command is replaced by the process's rank. Output lines are prefixed with ``[p<i>]``.

Failure handling: when any process exits non-zero (or is killed) the others are terminated
(SIGTERM, then SIGKILL after --grace seconds) and the launcher exits with that process's code
(128 + signal for a signal); past --timeout everything is killed and the exit code is 124. Every
process runs in its own session, so its children die with it.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _with_device_count(xla_flags: str, n: int) -> str:
    flag = f"--xla_force_host_platform_device_count={n}"
    if "--xla_force_host_platform_device_count" in xla_flags:
        return re.sub(r"--xla_force_host_platform_device_count=\d+", flag, xla_flags)
    return (xla_flags + " " + flag).strip()


def process_env(
    process_id: int,
    num_processes: int,
    port: int,
    devices_per_process: int | None,
    base: dict[str, str] | None = None,
) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env["JAX_COORDINATOR_ADDRESS"] = f"127.0.0.1:{port}"
    env["JAX_NUM_PROCESSES"] = str(num_processes)
    env["JAX_PROCESS_ID"] = str(process_id)
    env.setdefault("JAX_PLATFORMS", "cpu")
    env["PYTHONUNBUFFERED"] = "1"
    if devices_per_process:
        env["XLA_FLAGS"] = _with_device_count(env.get("XLA_FLAGS", ""), devices_per_process)
    return env


def _pump(stream, prefix: str, out) -> None:
    for line in iter(stream.readline, b""):
        out.write(prefix + line.decode(errors="replace"))
        out.flush()
    stream.close()


def _kill(procs: Sequence[subprocess.Popen], grace: float) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def _code(rc: int) -> int:
    return 128 - rc if rc < 0 else rc


def launch(
    num_processes: int,
    command: Sequence[str],
    *,
    devices_per_process: int | None = None,
    timeout: float = 600.0,
    grace: float = 5.0,
    port: int | None = None,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> int:
    """Run `command` as `num_processes` ranks; the launcher's exit code (see module docstring)."""
    if num_processes < 1:
        raise ValueError(f"num_processes={num_processes} is invalid: valid values are >= 1")
    if not command:
        raise ValueError("command is empty: give the program to run after '--'")
    port = port or free_port()
    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    try:
        for i in range(num_processes):
            argv = [a.replace("{process_id}", str(i)) for a in command]
            p = subprocess.Popen(
                argv,
                env=process_env(i, num_processes, port, devices_per_process, env),
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            procs.append(p)
            t = threading.Thread(target=_pump, args=(p.stdout, f"[p{i}] ", sys.stdout), daemon=True)
            t.start()
            pumps.append(t)
        deadline = time.monotonic() + timeout
        while True:
            codes = [p.poll() for p in procs]
            failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                i, c = failed[0]
                print(
                    f"[launch] process {i} exited with {_code(c)}; stopping the others",
                    file=sys.stderr,
                    flush=True,
                )
                _kill(procs, grace)
                return _code(c)
            if all(c == 0 for c in codes):
                return 0
            if time.monotonic() > deadline:
                print(f"[launch] timeout after {timeout:.0f} s; killing all", file=sys.stderr)
                _kill(procs, grace)
                return 124
            time.sleep(0.05)
    finally:
        _kill(procs, grace)
        for t in pumps:
            t.join(timeout=2.0)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: launch_local.py -n N [options] -- command ...", file=sys.stderr)
        return 2
    cut = argv.index("--")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--num-processes", type=int, required=True)
    ap.add_argument("--devices-per-process", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds before killing all")
    ap.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL")
    ap.add_argument("--port", type=int, default=None, help="coordinator port (default: a free one)")
    args = ap.parse_args(argv[:cut])

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(signum)

    signal.signal(signal.SIGTERM, on_signal)
    try:
        return launch(
            args.num_processes,
            argv[cut + 1 :],
            devices_per_process=args.devices_per_process,
            timeout=args.timeout,
            grace=args.grace,
            port=args.port,
        )
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
