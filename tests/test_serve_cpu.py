"""Serving mode on CPU (issue 13): real `vllm serve` instances with this project's connector; the
router in front of the prefill and decode instances, used as a user would (`python -m
harness.router`): its answers equal a colocated instance's, streamed or not, every transfer's
digests match, and no KV block stays held afterwards; the load generator's arrivals; and
`python -m harness runner=serve` end to end, against its own instances or running endpoints,
with bad input and an instance that dies."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import harness.__main__  # noqa: F401 - registers the config's resolvers
from harness.instances import serve_command, vllm_instance
from harness.load import LoadSpec, arrival_schedule
from harness.records import read_jsonl
from harness.results import load_requests, load_runs
from harness.router import Pool, Router
from harness.run import engine_args, engine_env, free_port, transfer_config
from tests.conftest import run_harness

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = [[(7 * i + 3 * k) % 500 + 3 for i in range(n)] for k, n in enumerate((5, 40, 97, 130, 33, 64))]
MAX_TOKENS = 8


def config(*overrides: str):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["device=cpu", "engine.max_model_len=512", "engine.kv_cache_gib=0.25",
                                           *overrides])
    OmegaConf.resolve(cfg)
    return cfg


def test_engine_arguments_become_vllm_serve_flags():
    cmd = serve_command({"model": "/m", "enforce_eager": True, "enable_prefix_caching": False, "seed": 0,
                         "disable_log_stats": True, "kv_cache_memory_bytes": 1024, "gpu_memory_utilization": None,
                         "kv_transfer_config": {"kv_role": "kv_producer"}}, port=8123)
    assert cmd[cmd.index("serve") + 1] == "/m" and cmd[cmd.index("--port") + 1] == "8123"
    assert "--enforce-eager" in cmd and "--no-enable-prefix-caching" in cmd and "--disable-log-stats" not in cmd
    assert cmd[cmd.index("--kv-cache-memory-bytes") + 1] == "1024" and "--gpu-memory-utilization" not in cmd
    assert json.loads(cmd[cmd.index("--kv-transfer-config") + 1]) == {"kv_role": "kv_producer"}


def test_pools_pick_round_robin_or_the_least_busy_and_bad_settings_are_refused():
    rr = Pool(["http://a/", "http://b"], "round_robin")
    assert [rr.pick() for _ in range(3)] == ["http://a", "http://b", "http://a"]
    least = Pool(["http://a", "http://b"], "least_outstanding")
    least.outstanding["http://a"] = 2
    assert least.pick() == "http://b"
    for kwargs, message in [({"policy": "random"}, "unknown policy"), ({"handoff": "teleport"}, "unknown handoff"),
                            ({"handoff": "pull", "decode_submit": "early"}, "prefill's answer first")]:
        with pytest.raises(ValueError, match=message):
            Router(["http://a"], ["http://b"], **kwargs)
    with pytest.raises(ValueError, match="at least one"):
        Router(["http://a"], [])
    p = subprocess.run([sys.executable, "-m", "harness.router", "--prefill", "http://a", "--decode", "http://b",
                        "--handoff", "pull", "--decode-submit", "early"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.startswith("error: a pull handoff")


@pytest.fixture(scope="module")
def deployment(results_dir):
    """A colocated instance, a prefill and a decode instance (fused), and the router."""
    cfg = config("strategy=fused")
    run_dir = results_dir / "serve-fused"
    for f in run_dir.glob("*"):
        f.unlink()
    args, env = engine_args(cfg, "cpu"), engine_env(cfg, "cpu", 0)
    rendezvous = run_dir / "kv-channel.port"
    instances = {"baseline": vllm_instance("baseline", args, env, run_dir / "baseline.log")}
    for side in ("prefill", "decode"):
        kv = transfer_config(cfg, side, rendezvous, run_dir / f"{side}-transfers.jsonl")
        instances[side] = vllm_instance(side, {**args, "kv_transfer_config": kv}, env, run_dir / f"{side}.log")
    router = None
    try:
        for inst in instances.values():
            inst.start()
        for inst in instances.values():
            inst.wait_healthy(timeout_s=600)
        port = free_port()
        with open(run_dir / "router.log", "w") as log:
            router = subprocess.Popen([sys.executable, "-m", "harness.router", "--prefill", instances["prefill"].url,
                                       "--decode", instances["decode"].url, "--port", str(port)],
                                      cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                if httpx.get(url + "/health", timeout=10).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        yield {"router": url, "run_dir": run_dir, "model": str(cfg.model.path), **instances}
    finally:
        if router is not None:
            router.terminate()
            router.wait(10)
        for inst in instances.values():
            inst.stop()


def complete(url: str, model: str, prompt: list[int], stream: bool = False) -> str:
    body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True,
            "stream": stream}
    if not stream:
        r = httpx.post(url + "/v1/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]
    text = ""
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text += json.loads(line[6:])["choices"][0]["text"]
    return text


@pytest.mark.engine
def test_the_router_answers_as_a_colocated_instance_with_every_transfer_checked(deployment):
    d = deployment
    base = [complete(d["baseline"].url, d["model"], p) for p in PROMPTS]
    assert len(set(base)) > 1  # the trained model's answers depend on the prompt
    assert [complete(d["router"], d["model"], p) for p in PROMPTS] == base
    assert [complete(d["router"], d["model"], p, stream=True) for p in PROMPTS[:3]] == base[:3]

    def records(side):
        path = d["run_dir"] / f"{side}-transfers.jsonl"
        return {r["transfer_id"]: r for r in map(json.loads, path.read_text().splitlines())}
    sent, received = records("prefill"), records("decode")
    assert len(sent) == len(PROMPTS) + 3 and set(sent) == set(received)
    assert all(sent[t]["digests"] == received[t]["digests"] for t in sent)
    assert all(received[t]["error"] is None for t in received)
    for inst in (d["prefill"], d["decode"]):  # every block given back once the requests ended
        for _ in range(50):
            if inst.metric("vllm:kv_cache_usage_perc") == 0:
                break
            time.sleep(0.1)
        assert inst.metric("vllm:kv_cache_usage_perc") == 0, inst.name


# ---------------------------------------------------------------------- the load generator
def spec(**kw) -> LoadSpec:
    return LoadSpec(**{"request_rate": 10.0, "num_requests": 400, **kw})


def test_arrivals_have_the_requested_rate_and_burstiness_and_repeat_with_their_seed():
    prompts = [[1, 2], [3]]
    constant = arrival_schedule(spec(arrivals="constant"), prompts)
    assert [r.arrival_s for r in constant[:3]] == pytest.approx([0.0, 0.1, 0.2])
    assert [r.prompt_idx for r in constant[:3]] == [0, 1, 0] and constant[1].token_ids == [3]

    def gaps(s):
        return np.diff([r.arrival_s for r in arrival_schedule(s, prompts)])
    poisson, bursty, steady = gaps(spec()), gaps(spec(arrivals="gamma", burstiness=0.25)), \
        gaps(spec(arrivals="gamma", burstiness=4.0))
    for g in (poisson, bursty, steady):
        assert g.mean() == pytest.approx(0.1, rel=0.2)  # the rate asked for
    cv = [g.std() / g.mean() for g in (poisson, bursty, steady)]  # gamma's: 1/sqrt(shape)
    assert cv[0] == pytest.approx(1.0, rel=0.2) and cv[1] == pytest.approx(2.0, rel=0.25) \
        and cv[2] == pytest.approx(0.5, rel=0.2)
    assert [r.arrival_s for r in arrival_schedule(spec(), prompts)] == \
        [r.arrival_s for r in arrival_schedule(spec(), prompts)]
    assert gaps(spec(seed=1))[:5].tolist() != poisson[:5].tolist()
    assert {r.arrival_s for r in arrival_schedule(spec(request_rate=math.inf, num_requests=5), prompts)} == {0.0}
    timed = arrival_schedule(spec(num_requests=None, duration_s=2.0), prompts)
    assert 10 < len(timed) < 35 and timed[-1].arrival_s < 2.0
    cancelled = sum(r.cancel for r in arrival_schedule(spec(cancel_fraction=0.25), prompts))
    assert 60 < cancelled < 140


@pytest.mark.parametrize("override,message", [
    ("serve.request_rate=0", "serve.request_rate must be > 0"),
    ("serve.max_concurrency=0", "serve.max_concurrency must be >= 1"),
    ("serve.arrivals=bursts", "serve.arrivals must be one of"),
    ("serve.num_requests=null", "give one of serve.num_requests and serve.duration_s"),
    ("slo.ttft_ms=-5", "slo.ttft_ms must be > 0"),
    ("serve.endpoints.baseline=http://127.0.0.1:9", "needs both a baseline and a disagg URL"),
])
def test_bad_serving_input_is_one_line_and_exit_2_before_anything_starts(results_dir, override, message):
    run = run_harness(results_dir / "serve-bad", "runner=serve", override, timeout=120)
    lines = run.stderr.strip().splitlines()
    assert run.code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
    assert run.summary["status"] == "bad_input" and not (run.run_dir / "servers.json").exists()


def test_an_unreachable_endpoint_is_exit_2(results_dir):
    dead = f"http://127.0.0.1:{free_port()}"
    run = run_harness(results_dir / "serve-bad", "runner=serve", f"serve.endpoints.baseline={dead}",
                      f"serve.endpoints.disagg={dead}", timeout=120)
    assert run.code == 2 and f"serve.endpoints.baseline {dead} does not answer" in run.stderr


# ---------------------------------------------------------------------- runner=serve end to end
README_SERVE = ("runner=serve", "strategy=fused", "serve.request_rate=8", "serve.num_requests=12",
                "serve.cancel_fraction=0.25", "slo.ttft_ms=500")


@pytest.mark.engine
def test_the_serving_runner_checks_every_request_under_load(results_dir):
    """The README's example: instances, routers, the same schedule on both paths, every output
    and digest checked, cancelled requests leave no KV held, records the loader reads."""
    run = run_harness(results_dir / "serve-run", *README_SERVE)
    assert run.code == 0, run.stderr[-3000:]
    s = run.summary
    assert s["status"] == "ok" and s["runner"] == "serve" and s["request_rate"] == 8.0
    assert s["requests"] == s["base_requests"] == 12 and s["failed"] == s["base_failed"] == 0
    assert s["cancelled"] == s["base_cancelled"] >= 1  # the same requests cancelled on both paths
    assert s["match_rate"] == 1.0 and s["digest_checked"] == s["ok"] and s["digest_failures"] == 0
    assert s["baseline_self_match_rate"] is not None
    assert s["kv_cache_usage_at_end"] == {"prefill": 0.0, "decode": 0.0}
    assert 0 < s["slo_attainment"] <= 1 and s["goodput"] > 0 and s["achieved_rate"] > 0
    assert s["ttft_ms_p50"] > 0 and s["tpot_ms_p50"] > 0 and s["itl_ms_p99"] >= s["itl_ms_p50"]
    df = load_requests(run.run_dir)
    assert sorted(df["path"].value_counts().items()) == [("baseline", 12), ("baseline_repeat", 12), ("disagg", 12)]
    d = df[(df["path"] == "disagg") & (df["status"] == "ok")]
    assert d["match"].all() and d["digest_match"].all() and (d["bytes"] > 0).all()
    assert ((d["meets_slo"]) == (d["ttft_ms"] <= 500)).all()
    assert (df.groupby("request_idx")["arrival_s"].nunique() == 1).all()  # one schedule for every path
    runs = load_runs(run.run_dir)
    assert runs.loc[0, "runner.name"] == "serve" and runs.loc[0, "ttft_ms_p50"] == s["ttft_ms_p50"]
    servers = json.loads((run.run_dir / "servers.json").read_text())
    assert set(servers) == {"baseline", "prefill", "decode", "baseline_router", "router"}
    assert not any(group_alive(v["pid"]) for v in servers.values())


def group_alive(pid: int) -> bool:
    return bool(subprocess.run(["pgrep", "-g", str(pid)], capture_output=True, text=True).stdout.split())


@pytest.mark.engine
def test_a_running_deployment_is_measured_as_it_is(deployment, results_dir):
    """Bring your own deployment: endpoints already running (here the fixture's); nothing started,
    outputs checked against the baseline endpoint, no transfer records."""
    d = deployment
    run = run_harness(results_dir / "serve-external", "runner=serve", f"serve.endpoints.baseline={d['baseline'].url}",
                      f"serve.endpoints.disagg={d['router']}", "serve.num_requests=6", "serve.request_rate=inf")
    assert run.code == 0, run.stderr[-3000:]
    s = run.summary
    assert s["external_endpoints"] and s["ok"] == 6 and s["match_rate"] == 1.0 and s["digest_checked"] == 0
    assert not (run.run_dir / "servers.json").exists() and not (run.run_dir / "baseline.log").exists()
    assert d["decode"].alive() and d["prefill"].alive()


@pytest.mark.engine
def test_an_instance_that_dies_stops_the_run_with_exit_3_keeping_its_records(results_dir):
    run_dir = results_dir / "serve-death"
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "harness", f"hydra.run.dir={run_dir}", "device=cpu", "runner=serve",
           "serve.num_requests=400", "serve.request_rate=4", "serve.baseline_repeat=false"]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and len(read_jsonl(run_dir / "baseline.jsonl")) < 3:
            assert p.poll() is None, p.communicate()
            time.sleep(0.5)
        servers = json.loads((run_dir / "servers.json").read_text())
        os.kill(servers["decode"]["pid"], signal.SIGKILL)
        t_kill = time.monotonic()
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 3 and time.monotonic() - t_kill < 60
    assert "instance decode" in err and "exited with -9" in err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "engine_failed" and summary["base_requests"] >= 3
    assert len(read_jsonl(run_dir / "baseline.jsonl")) >= 3
    assert not any(group_alive(v["pid"]) for v in servers.values())


@pytest.mark.engine
def test_instances_stop_with_their_whole_process_group(deployment):
    """Last of the deployment's tests: it stops the decode instance."""
    d = deployment
    inst = d["decode"]
    pid = inst.proc.pid
    group = subprocess.run(["pgrep", "-g", str(pid)], capture_output=True, text=True).stdout.split()
    assert str(pid) in group and len(group) >= 2  # the API server and its engine core
    inst.stop()
    assert not inst.alive()
    assert subprocess.run(["pgrep", "-g", str(pid)], capture_output=True, text=True).stdout.split() == []
