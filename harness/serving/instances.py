"""The serving runner's HTTP servers, each its own process group: OpenAI-compatible `vllm serve`
instances (baseline, prefill, decode), with the same engine arguments and connector
configuration as the offline runner's engines (engine_config.engine_args, engine_config.transfer_config),
and the router in front of them (harness/serving/router.py).

    with vllm_instance("decode", args, env, run_dir / "decode.log") as decode:
        decode.wait_healthy(timeout_s=300)
        ... decode.url ...

An instance stops with its process group on every exit path: `stop()` (SIGTERM, then SIGKILL
after a grace period), the context manager, and the harness's own death (the API server gets
SIGKILL when the process that started it dies: PR_SET_PDEATHSIG; vLLM's engine core exits when
its API server does).

On CPU an instance is forked from the process that imported vLLM once (harness/forkserver.py),
and its engine core forked from its API server (harness/vllm_cli.py): a tiny instance is healthy
about 4 s after it starts instead of 24 (each import of vLLM is about 8 s on 2 cores). Its log
begins with the command line it is equivalent to.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from harness import PROJECT_ROOT, forkserver, process_group
from harness.engine_config import free_port

# engine_args keys that are not vllm serve flags, or that serving must not take as they are
_NOT_FLAGS = {"model", "disable_log_stats"}  # model is positional; stats feed /metrics (KV usage)


def serve_command(args: dict, port: int) -> list[str]:
    """`vllm serve` for engine arguments as engine_config.engine_args gives them (plus kv_transfer_config)."""
    cmd = [sys.executable, "-m", "harness.vllm_cli", "serve", str(args["model"]),
           "--host", "127.0.0.1", "--port", str(port)]
    for key, value in args.items():
        if key in _NOT_FLAGS or value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):  # vLLM's engine flags are --x / --no-x pairs
            cmd.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, dict):
            cmd += [flag, json.dumps(value)]
        else:
            cmd += [flag, str(value)]
    return cmd


def _die_with_parent() -> None:
    os.setsid()  # a process group of its own: stop() signals the API server and its engine core together
    forkserver.die_with_parent()


class InstanceDied(RuntimeError):
    pass


class ServerProcess:
    """One HTTP server (`command(port)` listens on the port, answers GET /health) in a process
    group of its own. Its port is picked when it starts, and picked again if another process took
    it before the server could bind it (a free port is only free until someone binds it: the
    engines started beside it bind ports of their own)."""

    START_ATTEMPTS = 3

    def __init__(self, name: str, command: Callable[[int], list[str]], env: dict, log_path: Path,
                 forked: bool = False):
        """forked: `command` is `python -m MODULE ...`, forked from the server process that imported
        vLLM where its environment allows (harness/forkserver.py), else run as it is."""
        self.name, self.command, self.forked = name, command, forked
        self.port: int | None = None
        self.cmd: list[str] = []
        self.env = {**os.environ, **env}
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen | None = None
        self._log_from = 0  # where this start's lines begin in the log
        self._attempts = 0
        self.segments: set[str] = set()  # /dev/shm files its processes mapped once it was healthy

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError(f"{self.name} has no URL before it starts")
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ServerProcess:
        self.port = free_port()
        self.cmd = self.command(self.port)
        self._attempts += 1
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._log_from = log.tell()
            log.write(f"$ {' '.join(self.cmd)}\n".encode())
            log.flush()
            self.proc = forkserver.start_module(self.name, self.cmd[2], self.cmd[3:], self.env, str(self.log_path)) \
                if self.forked else None
            if self.proc is None:
                self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             env=self.env, preexec_fn=_die_with_parent)
        return self

    def _lost_its_port(self) -> bool:
        """This start ended because its port was taken (EADDRINUSE), with another start left."""
        if self._attempts >= self.START_ATTEMPTS or not self.log_path.exists():
            return False
        with open(self.log_path, "rb") as log:
            log.seek(self._log_from)
            return b"address already in use" in log.read().lower()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def failure_message(self) -> str:
        tail = self.log_path.read_text(errors="replace").strip().splitlines()[-15:] if self.log_path.exists() else []
        code = self.proc.poll() if self.proc else None
        return f"instance {self.name} ({self.url}) exited with {code}; last lines of {self.log_path}:\n" + \
            "\n".join(tail)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def wait_healthy(self, timeout_s: float) -> None:
        """Until /health answers; InstanceDied if the process exits first or the time runs out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                if not self._lost_its_port():
                    raise InstanceDied(self.failure_message())
                self.stop(grace_s=1)
                self.start()
            if self.healthy():
                # what it maps now, removed at stop() too if none maps it then: an instance whose
                # engine died before it was stopped maps nothing any more (vLLM's MultiConnector
                # crash left 400 MiB of psm_* segments so)
                self.segments = process_group.segments_of_group(self.proc.pid)
                return
            time.sleep(0.5)
        raise InstanceDied(f"instance {self.name} ({self.url}) not healthy within {timeout_s:.0f} s; "
                           f"log: {self.log_path}")

    def metric(self, name: str) -> float | None:
        """One Prometheus gauge from /metrics (summed over its label sets), e.g. vllm:kv_cache_usage_perc."""
        values = self.metric_by(name, None)
        return sum(values.values()) if values else None

    def metric_by(self, name: str, label: str | None) -> dict[str | None, float]:
        """One metric's samples from /metrics summed by one label's value (None: all together),
        e.g. vllm:prompt_tokens_by_source_total by source; empty when the instance exports none."""
        try:
            with urllib.request.urlopen(self.url + "/metrics", timeout=5) as r:
                text = r.read().decode()
        except (urllib.error.URLError, ConnectionError):
            if not self.alive():  # it died after the last request (vLLM's MultiConnector at its stats, once)
                raise InstanceDied(self.failure_message()) from None
            raise
        out: dict[str | None, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name:
                    key = sample.labels.get(label) if label else None
                    out[key] = out.get(key, 0.0) + sample.value
        return out

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM to the group (vLLM shuts down cleanly), then SIGKILL until none of it is left:
        the engine core can outlive its API server, also when the server died by itself. Then the
        shared-memory segments its processes had mapped and a killed process could not remove
        (vLLM's message queues between API server and engine core) are removed (harness/process_group.py)."""
        if self.proc is None:
            return
        segments = self.segments | process_group.segments_of_group(self.proc.pid)
        try:
            self._stop_group(grace_s)
        finally:
            process_group.remove_unmapped(segments)

    def _stop_group(self, grace_s: float) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
                process_group.wait_gone(self.proc.pid, timeout_s=3.0)  # its resource tracker's cleanup
            except subprocess.TimeoutExpired:
                pass
        process_group.kill(self.proc.pid, self.proc.poll)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def vllm_instance(name: str, args: dict, env: dict, log_path: Path) -> ServerProcess:
    server = ServerProcess(name, lambda port: serve_command(args, port), env, log_path, forked=True)
    server.env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the API server needs its engine core process
    return server


def router_process(name: str, prefill: list[str], decode: list[str], log_path: Path, *options: str) -> ServerProcess:
    """`python -m harness.serving.router` in front of the instances at these URLs (no prefill: a plain
    load balancer over `decode`, for colocated instances)."""
    upstream = [a for url in prefill for a in ("--prefill", url)] + [a for url in decode for a in ("--decode", url)]
    return ServerProcess(name, lambda port: [sys.executable, "-m", "harness.serving.router", "--port", str(port),
                                             *options, *upstream], {"PYTHONPATH": str(PROJECT_ROOT)}, log_path)


@contextlib.contextmanager
def instance_behind_router(args: dict, env: dict, out: Path, startup_timeout_s: float):
    """One `vllm serve` instance with the project's router in front of it (a plain load
    balancer), logs in `out`, both stopped on the way out: the benchmark scripts' deployment.
    Yields (instance, router)."""
    instance = vllm_instance("instance", args, env, out / "instance.log")
    router = None
    try:
        instance.start().wait_healthy(startup_timeout_s)
        router = router_process("router", [], [instance.url], out / "router.log").start()
        router.wait_healthy(60)
        yield instance, router
    finally:
        for s in (router, instance):
            if s is not None:
                s.stop()
