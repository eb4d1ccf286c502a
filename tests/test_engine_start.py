"""How an engine process or a `vllm serve` instance starts (harness/forkserver.py): on CPU forked
from a server that imported vLLM once, in the environment a spawned process would see; spawned
(an instance: its command line) where that environment differs or CUDA is used."""

import os
import subprocess
import sys

import pytest

from harness import forkserver
from harness.engine_process import own_warmup_prompts
from harness.forkserver import Forked
from harness.forkserver import context as _context
from harness.serving.instances import ServerProcess

ENGINE_ENV = {"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def server_env() -> dict:
    """The variables the server imported vLLM with that this process lacks (it starts here unless
    an engine test started it already)."""
    _context(ENGINE_ENV)  # starts it, or asks its environment
    return {k: v for k, v in forkserver._server_env.items() if k not in os.environ or os.environ[k] != v}


@pytest.mark.slow  # the server imports vLLM (seconds) unless an engine test started it already
def test_cpu_engines_are_forked_from_a_server_that_imported_vllm_in_their_environment(monkeypatch):
    before = dict(os.environ)
    if forkserver._server_pid is None:  # no test's run has started the server yet
        assert _context(ENGINE_ENV).get_start_method() == "forkserver"
    assert dict(os.environ) == before  # the server started in the engine's environment, this process's unchanged
    mine = server_env()
    assert _context(mine).get_start_method() == "forkserver", forkserver.differences(mine)
    # variables an engine reads once it runs may differ between engines of one server
    assert _context(dict(mine, GLOO_SOCKET_IFNAME="kv0", HARNESS_NETNS="ns1")).get_start_method() == "forkserver"
    # one a library reads when imported (libgomp's) differs: that engine imports vLLM itself
    assert _context(dict(mine, OMP_WAIT_POLICY="ACTIVE")).get_start_method() == "spawn"
    # a variable the server started with changed here since (a spawned engine would inherit it)
    monkeypatch.setenv("PATH", os.environ["PATH"] + os.pathsep + "/nowhere")
    assert _context(mine).get_start_method() == "spawn"
    monkeypatch.undo()
    # one this process added since (a library's doing): the engine's environment is its own
    monkeypatch.setenv("HARNESS_TEST_ADDED_HERE", "1")
    assert _context(mine).get_start_method() == "forkserver"


def _compile_answers_known(conn) -> None:
    from torch._inductor import codecache, cpu_vec_isa

    try:
        codecache.torch_key.set(b"")  # refused where the value is known already
        torch_key = False
    except RuntimeError:
        torch_key = True
    conn.send((cpu_vec_isa.valid_vec_isa_list.cache_info().currsize == 1, torch_key))


@pytest.mark.slow  # the server imports vLLM (seconds) unless an engine test started it already
def test_a_forked_engine_finds_torch_compiles_process_wide_answers_known():
    """vLLM's sampler compiles a function at an engine's first request with log-probabilities;
    the CPU's vector instructions (compiler probes) and torch's source hash it looks up were
    found once by the server (harness/inductor_keys.py), not again in every engine."""
    ctx = _context(server_env())
    assert ctx.get_start_method() == "forkserver"
    mine, theirs = ctx.Pipe()
    p = ctx.Process(target=_compile_answers_known, args=(theirs,))
    p.start()
    assert mine.recv() == (True, True)
    p.join(30)


@pytest.mark.slow  # two imports of vLLM side by side
def test_a_runs_checks_start_the_server_and_its_engines_are_still_forked():
    """A CPU run's checks start the server before they import vLLM (engine_config.start_engine_server),
    and their imports set variables in this process's environment (TORCHINDUCTOR_CACHE_DIR, ...)
    that the server's own imports set alike: the engines are still forked, not spawned."""
    code = ("from tests.conftest import compose_config; from harness.checks import checked_inputs; "
            "from harness.engine_config import engine_env; from harness import forkserver; "
            "cfg = compose_config('device=cpu', 'runner=serve'); checked_inputs(cfg); "
            "started = forkserver._server_pid is not None; "
            "print(started, forkserver.context(engine_env(cfg, 'cpu', 0)).get_start_method())")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=os.path.dirname(os.path.dirname(__file__)))
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split()[-2:] == ["True", "forkserver"], p.stdout


def test_cuda_engines_are_spawned():
    assert _context({"CUDA_VISIBLE_DEVICES": "0"}).get_start_method() == "spawn"


@pytest.mark.slow
def test_a_server_forked_as_its_command_line_leads_its_group_and_stops_with_it(tmp_path):
    """A ServerProcess marked forked runs `python -m MODULE ...` in a process forked from the server
    (serving's CPU instances: vLLM's API server without importing vLLM again); with CUDA, the
    command line itself."""
    (tmp_path / "health").write_text("ok")  # what /health answers

    def web(env: dict) -> ServerProcess:
        return ServerProcess("web", lambda port: [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                                                  "--directory", str(tmp_path)], env, tmp_path / "web.log", forked=True)

    server = web(server_env())
    with server:
        server.wait_healthy(60)
        assert isinstance(server.proc, Forked) and os.getpgid(server.proc.pid) == server.proc.pid
    assert server.proc.poll() is not None
    assert (tmp_path / "web.log").read_text().startswith("$ " + sys.executable + " -m http.server")
    with web(dict(server_env(), CUDA_VISIBLE_DEVICES="")) as server:
        server.wait_healthy(60)
        assert isinstance(server.proc, subprocess.Popen)


def test_each_engine_warms_up_on_prompts_of_its_own():
    """vLLM's ExampleConnector stores and loads any prompt by its whole blocks' tokens: engines
    started side by side (pids close together) must not warm up on one prompt, or the decode
    engine loads the files its prefill engine is still writing."""
    prompts = {pid: own_warmup_prompts(pid, 103) for pid in range(4000, 4200)}
    assert all([len(p) for p in ps] == [3, 40, 100] for ps in prompts.values())
    assert all(3 <= t < 100 for ps in prompts.values() for p in ps for t in p)
    first_blocks = [tuple(p[:16]) for ps in prompts.values() for p in ps if len(p) > 16]
    assert len(set(first_blocks)) == len(first_blocks)
    assert own_warmup_prompts(4000, 103) == prompts[4000]  # seeded: a rerun warms up as this one did
    assert [len(p) for p in own_warmup_prompts(1, 64)] == [3, 40]  # within the engine's context
