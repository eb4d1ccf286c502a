"""Serving mode's first pieces on CPU (issue 13): real `vllm serve` instances with this project's
connector, and the router in front of the prefill and decode instances, used as a user would
(`python -m harness.router`): its answers equal a colocated instance's, streamed or not, every
transfer's digests match, and no KV block stays held afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import harness.__main__  # noqa: F401 - registers the config's resolvers
from harness.instances import ServeInstance, serve_command
from harness.router import Pool, Router
from harness.run import engine_args, engine_env, free_port, transfer_config

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
        Router([], ["http://b"])
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
    instances = {"baseline": ServeInstance("baseline", args, env, run_dir / "baseline.log")}
    for side in ("prefill", "decode"):
        kv = transfer_config(cfg, side, rendezvous, run_dir / f"{side}-transfers.jsonl")
        instances[side] = ServeInstance(side, {**args, "kv_transfer_config": kv}, env, run_dir / f"{side}.log")
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


@pytest.mark.engine
def test_instances_stop_with_their_whole_process_group(deployment):
    d = deployment
    inst = d["decode"]
    pid = inst.proc.pid
    group = subprocess.run(["pgrep", "-g", str(pid)], capture_output=True, text=True).stdout.split()
    assert str(pid) in group and len(group) >= 2  # the API server and its engine core
    inst.stop()
    assert not inst.alive()
    assert subprocess.run(["pgrep", "-g", str(pid)], capture_output=True, text=True).stdout.split() == []
