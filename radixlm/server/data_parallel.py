"""Data parallel serving: `radixlm serve --dp-size N` runs N replicas (each a full
`radixlm serve` process on its own loopback port) behind SGLang's router (PyPI
`sglang-router`, Rust), whose port is the server's port.

The router is SGLang's own; we only launch it. What it asks a worker for (`/health`,
`/server_info`, `/model_info`, `/get_load`) the native API answers. Replicas and router
are children of this process: a signal to it ends them all; a replica that dies leaves
the others serving (the router's health check drops it); a router that dies ends the
whole server with an error.
"""

from __future__ import annotations

import logging
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

import requests

logger = logging.getLogger("radixlm.server")

ROUTER_POLICIES = ("cache_aware", "round_robin", "random", "power_of_two")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def router_available() -> bool:
    """Whether `sglang_router` is installed (the `dp` extra)."""
    import importlib.util

    return importlib.util.find_spec("sglang_router") is not None


def replica_command(serve_argv: Sequence[str], port: int) -> list[str]:
    """The `radixlm serve` command line of one replica: the server's own arguments with
    the port replaced, bound to loopback and with data parallelism off."""
    argv = _drop_options(serve_argv, {"--port": 1, "--host": 1, "--dp-size": 1, "--dp": 1,
                                      "--router-policy": 1})
    return [sys.executable, "-m", "radixlm.cli", "serve", *argv,
            "--host", "127.0.0.1", "--port", str(port), "--dp-size", "1"]


def router_command(host: str, port: int, worker_urls: Sequence[str], policy: str,
                   log_level: str = "warn") -> list[str]:
    """The `sglang_router.launch_router` command line in front of `worker_urls`."""
    if policy not in ROUTER_POLICIES:
        raise ValueError(f"router policy must be one of {'|'.join(ROUTER_POLICIES)}, "
                         f"got {policy!r}")
    return [sys.executable, "-m", "sglang_router.launch_router", "--host", host,
            "--port", str(port), "--policy", policy, "--worker-urls", *worker_urls,
            "--log-level", log_level, "--health-check-interval-secs", "2",
            # its own Prometheus exporter (default port 29000 may be taken)
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]


def _drop_options(argv: Sequence[str], options: dict[str, int]) -> list[str]:
    """`argv` without each `--name VALUE` (or `--name=VALUE`) listed in `options`."""
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        name = arg.split("=", 1)[0]
        if name in options:
            i += 1 if "=" in arg else 1 + options[name]
            continue
        out.append(arg)
        i += 1
    return out


def _wait_ready(url: str, procs: list[subprocess.Popen], limit_s: float, what: str) -> None:
    """Poll `url` until it answers 200; raise if a child in `procs` exits or time runs out."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{what}: a child process exited with {p.returncode} "
                                   f"({' '.join(p.args[:6])} ...)")
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{what}: {url} not ready after {limit_s:.0f} s")


def _stop(procs: list[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM every live child, wait up to `grace_s`, then SIGKILL what is left."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


def serve_data_parallel(serve_argv: Sequence[str], host: str, port: int, dp_size: int,
                        policy: str = "cache_aware", shutdown_timeout: float = 30.0,
                        ready_timeout: float = 600.0,
                        on_ready: Callable[[list[str]], None] | None = None) -> int:
    """Run `dp_size` replicas and the router until SIGTERM/SIGINT; return the exit code.

    `serve_argv` are the `radixlm serve` arguments given to this process (each replica gets
    them with its own port). Bad options fail in the first replica and end the launch."""
    if dp_size < 2:
        raise ValueError("serve_data_parallel needs dp_size >= 2")
    if not router_available():
        logger.error("--dp-size needs sglang-router: pip install 'radixlm[dp]'")
        return 2
    ports = [free_port() for _ in range(dp_size)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    stopping = False

    def on_signal(sig: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        logger.info("signal %s: stopping the router and %d replicas", sig, dp_size)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    replicas: list[subprocess.Popen] = []
    router: subprocess.Popen | None = None
    try:
        for i, (p, url) in enumerate(zip(ports, urls)):
            replicas.append(subprocess.Popen(replica_command(serve_argv, p)))
            logger.info("replica %d: %s (pid %d)", i, url, replicas[-1].pid)
        for url in urls:
            _wait_ready(url + "/health", replicas, ready_timeout, "starting the replicas")
        router = subprocess.Popen(router_command(host, port, urls, policy))
        logger.info("router (%s, pid %d) on http://%s:%d -> %s", policy, router.pid, host,
                    port, " ".join(urls))
        _wait_ready(f"http://{host}:{port}/readiness", [router], 60.0, "starting the router")
        logger.info("serving with dp_size=%d on http://%s:%d", dp_size, host, port)
        if on_ready is not None:
            on_ready(urls)
        gone: set[int] = set()
        while not stopping:
            if router.poll() is not None:
                logger.error("the router exited with %s; stopping", router.returncode)
                return 1
            for i, r in enumerate(replicas):
                if i not in gone and r.poll() is not None:
                    gone.add(i)
                    logger.warning("replica %d exited with %s; the others keep serving", i,
                                   r.returncode)
            time.sleep(0.2)
        return 0
    except RuntimeError as exc:
        logger.error("%s", exc)
        return 1
    finally:
        _stop([router] if router is not None else [], 10.0)
        _stop(replicas, shutdown_timeout + 10.0)
        for s, h in old.items():
            signal.signal(s, h)
