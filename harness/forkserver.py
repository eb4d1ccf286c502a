"""Processes forked from one server process that imported vLLM once: engines and `vllm serve`.

Importing vLLM and torch is about 8 s of a tiny engine's start-up on the 2-core machine, paid
once per harness process instead of once per engine or instance: a CPU engine
(harness/engine_process.py) and a CPU `vllm serve` instance (harness/serving/instances.py) are
forked from multiprocessing's forkserver, whose server imported vLLM in the environment a
spawned process would see now. Where that environment differs, or CUDA is used (CUDA must not be
touched before a fork, and graph capture dominates a GPU start-up anyway), they start as fresh
interpreters: an engine spawned, an instance as its command line.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import multiprocessing as mp
import os
import runpy
import signal
import subprocess
import sys
import warnings
from multiprocessing import forkserver

# Forked processes leave on os._exit / SIGKILL, so vLLM's semaphores are reclaimed by the resource
# tracker they share with this process, which would warn about each one at exit. Set on import,
# before any server starts: the servers' environment is compared with this process's.
os.environ.setdefault("PYTHONWARNINGS", "ignore::UserWarning:multiprocessing.resource_tracker")

NETNS_ENV = "HARNESS_NETNS"  # the network namespace an engine process enters before vLLM starts (run.netns)

# What the server imports before it forks (their start-up without the imports); the API server's
# modules add half a second to vLLM's eight. A run's checks import the CPU attention backend, which
# sets a variable (AITER_SITUV2_A4W4): the server imports it too, or no engine of that run is forked.
# harness.inductor_keys: what torch.compile looks up at an engine's first request, found once here.
PRELOAD = ["vllm", "vllm.entrypoints.llm", "vllm.v1.engine.llm_engine", "vllm.config", "harness.engine_process",
           "harness.vllm_cli", "vllm.entrypoints.cli.main", "vllm.entrypoints.openai.api_server",
           "vllm.entrypoints.cli.serve", "vllm.v1.engine.async_llm", "vllm.v1.attention.backends.cpu_attn",
           "harness.inductor_keys"]
# environment variables read only once a process runs (engine_env, serving's instances): they may
# differ between processes forked from one server. Any other variable may be read when a library is
# imported (libgomp reads OMP_WAIT_POLICY when torch loads it, huggingface_hub HF_HUB_OFFLINE when
# vLLM imports it).
PER_ENGINE_ENV = {NETNS_ENV, "GLOO_SOCKET_IFNAME", "VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT",
                  "VLLM_ENABLE_V1_MULTIPROCESSING",  # offline engines keep their engine core in-process
                  "UCX_TLS", "UCX_NET_DEVICES",  # read when NIXL's agent starts in an engine (a link's)
                  "PYTEST_CURRENT_TEST"}  # pytest's, set anew for every test
_started_env: dict | None = None  # the environment the server started in, less PER_ENGINE_ENV
_server_env: dict | None = None  # the server's once it imported vLLM, less PER_ENGINE_ENV
_server_pid: int | None = None


def start_server(env: dict) -> None:
    """Start the server in this process's environment updated with `env`, unless it runs already;
    returns at once, while the server imports vLLM. Not for CUDA (never touched before a fork)."""
    global _server_pid, _started_env
    if _server_pid is not None or "CUDA_VISIBLE_DEVICES" in env:
        return
    saved = dict(os.environ)
    os.environ.update(env)  # the server inherits this process's environment when it starts
    try:
        forkserver.set_forkserver_preload(PRELOAD)
        forkserver.ensure_running()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    _started_env = _engine_independent(dict(os.environ, **env))
    _server_pid = forkserver._forkserver._forkserver_pid
    # a server still importing would outlive an early exit (bad input) by its import's seconds
    atexit.register(_stop_server, _server_pid)


def context(env: dict):
    """How a process with this environment (this process's, updated with `env`) starts: forked from
    the server where it would have imported vLLM in the same environment less PER_ENGINE_ENV, else
    spawned. The server starts with the first CPU process unless a run's checks started it
    (engine_config.start_engine_server). Importing vLLM sets variables (TORCHINDUCTOR_CACHE_DIR, ...),
    in the server and in a process that imports it: each may hold the value it had before or the
    one the import set."""
    global _server_env
    if "CUDA_VISIBLE_DEVICES" in env:
        return mp.get_context("spawn")
    start_server(env)
    if _server_env is None:
        _server_env = _engine_independent(_environ_of_server())
    return mp.get_context("spawn" if differences(env) else "forkserver")


def differences(env: dict) -> dict:
    """Where a process of this environment would differ from the started server: {variable: (its
    value, the values the server allows)} (None: unset). A variable this process added since the
    server started, and `env` does not set, is this process's own: a library running here set it
    (a vLLM config built here: LD_PRELOAD, VLLM_WORKER_MULTIPROC_METHOD, ...), and an engine forked
    from the server does not inherit it."""
    mine = _engine_independent(dict(os.environ, **env))
    out = {}
    for k in {*mine, *_started_env, *_server_env}:
        if k not in _started_env and k not in env:
            continue
        values = (_started_env.get(k), _server_env.get(k))
        if mine.get(k) not in values:
            out[k] = (mine.get(k), values)
    return out


def _engine_independent(env: dict) -> dict:
    return {k: v for k, v in env.items() if k not in PER_ENGINE_ENV}


def _environ_of_server() -> dict:
    """The server's environment after its preload: a process forked from it tells (it starts once
    the preload is done, as any fork would wait)."""
    ctx = mp.get_context("forkserver")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_send_environ, args=(send,), name="environ-of-server")
    child.start()
    send.close()
    try:
        return receive.recv()
    finally:
        receive.close()
        child.join()


def _send_environ(send) -> None:
    send.send(dict(os.environ))


def _stop_server(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


def die_with_parent() -> None:
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Forked:
    """What subprocess.Popen gives of a process forked from the server: pid, poll(), wait()."""

    def __init__(self, process: mp.Process):
        self.process, self.pid = process, process.pid

    def poll(self) -> int | None:
        return self.process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(f"forked {self.pid}", timeout)
        return self.process.exitcode


def _run_module(module: str, argv: list[str], env: dict, log_path: str) -> None:
    """`python -m module *argv` in this process, as a fresh interpreter runs it: its own process
    group, the environment it was given, its output appended to the log. The module runs as
    __main__, so a process it spawns imports it again as its main (harness.vllm_cli's patch
    reaches vLLM's engine core, as it does under `python -m`)."""
    os.setsid()
    die_with_parent()
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = [module, *argv]
    # run as __main__ though imported already (the server's preload): what runpy warns of is the point
    warnings.filterwarnings("ignore", message=".*found in sys.modules after import of package", category=RuntimeWarning)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def start_module(name: str, module: str, argv: list[str], env: dict, log_path: str) -> Forked | None:
    """`python -m module *argv` with this full environment, forked from the server; None where its
    environment needs a fresh interpreter (then start the command line itself)."""
    ctx = context({k: v for k, v in env.items() if os.environ.get(k) != v})  # what it sets otherwise than here
    if ctx.get_start_method() != "forkserver":
        return None
    process = ctx.Process(target=_run_module, name=name, args=(module, argv, env, log_path))
    process.start()
    return Forked(process)
