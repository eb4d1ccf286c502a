"""How an engine process starts (harness/engine_process.py `_context`): on CPU forked from a
server that imported vLLM once, in the environment a spawned engine would see; spawned where that
environment differs or CUDA is used."""

import os

import pytest

from harness import engine_process
from harness.engine_process import _context


@pytest.mark.slow  # the server imports vLLM (seconds) unless an engine test started it already
def test_cpu_engines_are_forked_from_a_server_that_imported_vllm_in_their_environment(monkeypatch):
    env = {"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    before = dict(os.environ)
    if engine_process._server_env is None:  # no engine test has started the server yet
        assert _context(env).get_start_method() == "forkserver"
    assert dict(os.environ) == before  # the server started in the engine's environment, this process's unchanged
    server = engine_process._server_env
    mine = {k: v for k, v in server.items() if k not in os.environ or os.environ[k] != v}
    assert _context(mine).get_start_method() == "forkserver"
    # variables an engine reads once it runs may differ between engines of one server
    assert _context(dict(mine, GLOO_SOCKET_IFNAME="kv0", HARNESS_NETNS="ns1")).get_start_method() == "forkserver"
    # one a library reads when imported (libgomp's) differs: that engine imports vLLM itself
    assert _context(dict(mine, OMP_WAIT_POLICY="ACTIVE")).get_start_method() == "spawn"
    # this process's environment changed since (a spawned engine would inherit the change)
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", server.get("TRANSFORMERS_VERBOSITY", "") + "x")
    assert _context(mine).get_start_method() == "spawn"


def test_cuda_engines_are_spawned():
    assert _context({"CUDA_VISIBLE_DEVICES": "0"}).get_start_method() == "spawn"
