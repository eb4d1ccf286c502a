"""Serving mode on CPU (issue 13): the router's and the load generator's parts, and `python -m
harness runner=serve` end to end with its own instances (1P1D, 2P1D with the prefill's token
streamed), bad input, a request past its time limit, and an instance that dies. The tests on one
shared deployment are in test_serve_deployment.py."""

from __future__ import annotations

import json
import math
import os
import runpy
import shutil
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

import harness.startup  # noqa: F401 - registers the config's resolvers
from harness import process_group
from harness.engine_config import free_port
from harness.records.files import read_jsonl
from harness.records.schema import HANDOVER_PARTS
from harness.report.load import load_requests, load_runs
from harness.serving import arrivals
from harness.serving.checks import check_instances
from harness.serving.instances import InstanceDied, ServerProcess, serve_command
from harness.serving.load import TIMED_OUT, LoadError, LoadSpec, arrival_schedule
from harness.serving.pool import PREFIX_TOKENS, Pool
from harness.serving.router import Router
from harness.settings import settle
from tests.conftest import FULL, SLOW, compose_config, refused_in_process, run_harness
from tests.helpers.runs import left_in_shm, shm_now
from tests.helpers.serving import config

ROOT = Path(__file__).resolve().parent.parent


def test_engine_arguments_become_vllm_serve_flags():
    cmd = serve_command({"model": "/m", "enforce_eager": True, "enable_prefix_caching": False, "seed": 0,
                         "disable_log_stats": True, "kv_cache_memory_bytes": 1024, "gpu_memory_utilization": None,
                         "kv_transfer_config": {"kv_role": "kv_producer"}}, port=8123)
    assert cmd[cmd.index("serve") + 1] == "/m" and cmd[cmd.index("--port") + 1] == "8123"
    assert "--enforce-eager" in cmd and "--no-enable-prefix-caching" in cmd and "--disable-log-stats" not in cmd
    assert cmd[cmd.index("--kv-cache-memory-bytes") + 1] == "1024" and "--gpu-memory-utilization" not in cmd
    assert json.loads(cmd[cmd.index("--kv-transfer-config") + 1]) == {"kv_role": "kv_producer"}


SERVER = """
import http.server, pathlib, sys
port, marker = int(sys.argv[1]), pathlib.Path(sys.argv[2])
if not marker.exists():  # the first start finds its port taken
    marker.touch()
    sys.exit("OSError: [Errno 98] error while attempting to bind on address: address already in use")
if sys.argv[3] == "die":
    sys.exit("something else went wrong")
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def test_a_server_whose_port_was_taken_starts_again_on_another(tmp_path):
    """A free port is free only until someone binds it (the engines started beside a server bind
    theirs): a server that lost its port starts again on a new one; any other exit is its death."""
    for then in ("serve", "die"):
        marker = tmp_path / then
        server = ServerProcess("s", lambda port, m=marker, t=then: [sys.executable, "-c", SERVER, str(port), str(m), t],
                               {}, tmp_path / f"{then}.log")
        try:
            server.start()
            first = server.port
            if then == "serve":
                server.wait_healthy(30)
                assert server.alive() and server._attempts == 2 and server.port is not None
                assert server.log_path.read_text().count("$ ") == 2 and str(first) in server.log_path.read_text()
            else:
                with pytest.raises(InstanceDied, match="something else went wrong"):
                    server.wait_healthy(30)
                # a dead instance asked for its metrics (the KV usage at a run's end) says it died
                with pytest.raises(InstanceDied, match="something else went wrong"):
                    server.metric("vllm:kv_cache_usage_perc")
        finally:
            server.stop(1)


def test_pools_pick_round_robin_or_the_least_busy_and_bad_settings_are_refused():
    rr = Pool(["http://a/", "http://b"], "round_robin")
    assert [rr.pick() for _ in range(3)] == ["http://a", "http://b", "http://a"]
    least = Pool(["http://a", "http://b"], "least_outstanding")
    least.outstanding["http://a"] = 2
    # a pick counts at once, so that requests sent together spread
    assert [least.pick() for _ in range(3)] == ["http://b", "http://b", "http://a"]
    least.done("http://a")
    assert least.outstanding == {"http://a": 2, "http://b": 2}
    for kwargs, message in [({"policy": "random"}, "unknown policy"), ({"handoff": "teleport"}, "unknown handoff"),
                            ({"handoff": "relay", "decode_submit": "early"}, "prefill's answer first")]:
        with pytest.raises(ValueError, match=message):
            Router(["http://a"], ["http://b"], **kwargs)
    with pytest.raises(ValueError, match="at least one"):
        Router(["http://a"], [])
    # the negative control travels with each decode request (one engine pair serves both)
    plain, corrupt = Router(["http://a"], ["http://b"]), Router(["http://a"], ["http://b"], corrupt=True)
    assert "corrupt" not in plain.decode_body({}, "t", None)["kv_transfer_params"]
    assert corrupt.decode_body({}, "t", None)["kv_transfer_params"]["corrupt"] is True
    assert "corrupt" not in corrupt.prefill_body({}, "t")["kv_transfer_params"]
    # relay: NIXL's answer relayed, with the transfer id (and the negative control) for the observer
    relay = Router(["http://a"], ["http://b"], handoff="relay", decode_submit="after_prefill", corrupt=True)
    assert relay.prefill_body({}, "t")["kv_transfer_params"] == {"do_remote_decode": True, "transfer_id": "t"}
    answer = {"kv_transfer_params": {"do_remote_prefill": True, "remote_block_ids": [[1]]}}
    assert relay.decode_body({}, "t", answer)["kv_transfer_params"] == {
        "do_remote_prefill": True, "remote_block_ids": [[1]], "transfer_id": "t", "corrupt": True}
    p = subprocess.run([sys.executable, "-m", "harness.serving.router", "--prefill", "http://a", "--decode", "http://b",
                        "--handoff", "relay", "--decode-submit", "early"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.startswith("error: a relay handoff")


def test_prefix_hash_sends_prompts_that_share_their_first_tokens_to_one_instance():
    """serve.prefill_policy=prefix_hash: a prompt's first PREFIX_TOKENS tokens pick the instance
    (rendezvous hashing), so a conversation's turns and prompts with one system prompt meet their
    prefix cache; different prefixes spread; an instance removed moves only the prefixes it held."""
    urls = [f"http://p{i}" for i in range(4)]
    pool = Pool(urls, "prefix_hash")
    prompts = [[k] * PREFIX_TOKENS for k in range(200)]
    picked = [pool.pick({"prompt": p + [7, 8, 9]}) for p in prompts]
    assert picked == [pool.pick({"prompt": p + [1] * 50}) for p in prompts]  # the rest of the prompt does not count
    assert all(20 <= picked.count(u) <= 80 for u in urls)  # 50 each on average
    assert pool.pick({"prompt": "a text prompt"}) == pool.pick({"prompt": "a text prompt"})
    assert pool.pick({"messages": [{"role": "user", "content": "hi"}]}) in urls
    fewer = Pool(urls[:3], "prefix_hash")
    assert all(fewer.pick({"prompt": p}) == u for p, u in zip(prompts, picked) if u != urls[3])
    router = Router(urls[:2], ["http://d"], policy="least_outstanding", prefill_policy="prefix_hash")
    assert router.prefill.policy == "prefix_hash" and router.decode.policy == "least_outstanding"
    for override in ("serve.policy=random", "serve.prefill_policy=sticky"):
        with pytest.raises(LoadError, match=override.split("=")[0]):
            check_instances(config("runner=serve", override))


# ---------------------------------------------------------------------- the load generator
def spec(**kw) -> LoadSpec:
    return LoadSpec(**{"request_rate": 10.0, "num_requests": 400, **kw})


def test_arrivals_have_the_requested_rate_and_burstiness_and_repeat_with_their_seed():
    prompts = [[1, 2], [3]]
    constant = arrival_schedule(spec(arrivals=arrivals.constant), prompts)
    assert [r.arrival_s for r in constant[:3]] == pytest.approx([0.0, 0.1, 0.2])
    assert [r.prompt_idx for r in constant[:3]] == [0, 1, 0] and constant[1].token_ids == [3]

    def gaps(s):
        return np.diff([r.arrival_s for r in arrival_schedule(s, prompts)])
    poisson, bursty, steady = gaps(spec()), gaps(spec(arrivals=partial(arrivals.gamma, burstiness=0.25))), \
        gaps(spec(arrivals=partial(arrivals.gamma, burstiness=4.0)))
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


def test_a_ramp_up_moves_the_rate_from_start_to_end_as_vllm_bench_serve_does():
    prompts = [[1, 2]]
    linear = arrival_schedule(spec(arrivals=arrivals.constant, num_requests=5, ramp_up="linear",
                                   ramp_up_start_rps=1, ramp_up_end_rps=9), prompts)
    # request i's rate at progress i / 4: 1, 3, 5, 7, 9 req/s; each gap at its request's rate
    assert [r.arrival_s for r in linear] == pytest.approx([0.0, 1 / 3, 1 / 3 + 1 / 5, 1 / 3 + 1 / 5 + 1 / 7,
                                                           1 / 3 + 1 / 5 + 1 / 7 + 1 / 9])
    expo = spec(num_requests=3, ramp_up="exponential", ramp_up_start_rps=1, ramp_up_end_rps=16)
    assert [expo.rate_at(i) for i in range(3)] == pytest.approx([1, 4, 16])
    poisson = np.diff([r.arrival_s for r in arrival_schedule(spec(num_requests=2000, ramp_up="linear",
                                                                  ramp_up_start_rps=2, ramp_up_end_rps=20), prompts)])
    assert 1 / poisson[:100].mean() == pytest.approx(2.5, rel=0.25)  # the first 5%: about 2-3 req/s
    assert 1 / poisson[-100:].mean() == pytest.approx(19.5, rel=0.25)
    for bad, message in (({"ramp_up": "steps"}, "serve.ramp_up must be linear, exponential or null"),
                         ({"ramp_up": "linear", "ramp_up_start_rps": 0, "ramp_up_end_rps": 4}, "ramp_up_start_rps > 0"),
                         ({"ramp_up": "linear", "ramp_up_start_rps": 1, "ramp_up_end_rps": 4, "num_requests": None,
                           "duration_s": 5.0}, "rate over serve.num_requests")):
        with pytest.raises(LoadError, match=message):
            arrival_schedule(spec(**bad), prompts)


def test_probes_are_a_short_request_every_interval_through_the_load():
    from harness.serving.schedule import probe_schedule

    load = arrival_schedule(spec(arrivals=arrivals.constant, num_requests=12), [[1]])  # 10 req/s up to 1.1 s
    probes, prompts = probe_schedule(config("runner=serve", "serve.probes.interval_s=0.25"), load)
    assert [p.arrival_s for p in probes] == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])
    assert all(len(p.token_ids) == 16 and p.max_tokens == 4 for p in probes)
    assert len({tuple(p.token_ids) for p in probes}) == 5
    assert [q.token_ids for q in prompts] == [p.token_ids for p in probes]
    assert probe_schedule(config("runner=serve"), load) == ([], [])


def test_each_arrival_pattern_is_its_yaml_and_its_function():
    """A new pattern is one function in harness/serving/arrivals.py and one conf/arrivals/*.yaml:
    composed by name, its parameters from the YAML, seeded like the others."""
    from harness.serving.arrivals import build

    prompts = [[1, 2]]
    names = sorted(p.stem for p in (ROOT / "conf" / "arrivals").glob("*.yaml"))
    assert names == ["constant", "gamma", "poisson"]
    for name, overrides, cv in (("constant", [], 0.0), ("poisson", [], 1.0),
                                ("gamma", ["arrivals.burstiness=0.25"], 2.0)):
        cfg = config("runner=serve", f"arrivals={name}", *overrides)
        assert cfg.arrivals.name == name
        g = np.diff([r.arrival_s for r in arrival_schedule(spec(arrivals=build(cfg.arrivals)), prompts)])
        assert g.mean() == pytest.approx(0.1, rel=0.2) and g.std() / g.mean() == pytest.approx(cv, rel=0.25, abs=1e-9)
    # the default pattern draws the schedules the committed serving runs were given (gamma of shape 1)
    rng = np.random.default_rng(0)
    before = np.cumsum([0.0] + [rng.gamma(1.0, 1 / 10.0) for _ in range(9)])
    default = build(config("runner=serve").arrivals)
    assert [r.arrival_s for r in arrival_schedule(spec(arrivals=default, num_requests=10), prompts)] == \
        pytest.approx(before.tolist(), rel=1e-12)


def test_a_stream_that_came_in_bursts_is_flagged_and_counted():
    """vLLM merges a request's streamed outputs while its API server is behind: a stream whose
    tokens arrived together is flagged (ServeRow.coalesced), counted per path, and the summary
    says what that does to its TPOT and ITL."""
    from harness.records.tables import format_serve_summary
    from harness.serving.load import ClientResult
    from harness.serving.rows import row
    from harness.workload import Prompt
    from tests.helpers.serving import serve_summary_of

    cfg = config("runner=serve")

    def client(i, gaps_ms):
        times = [0.010 + sum(gaps_ms[:k]) / 1e3 for k in range(len(gaps_ms) + 1)]
        return ClientResult(i, i, 8, 0.0, 0.0, t_first=times[0], t_done=times[-1], token_times=times,
                            token_ids=list(range(len(times))), logprobs=[0.0] * len(times))

    def made(path, i, gaps_ms):
        return row(settle(cfg, "cpu"), "r", path, client(i, gaps_ms), Prompt(i, [1] * 8), None, None, 4.0)

    burst = made("baseline", 0, [0.01] * 12 + [9.0] * 3)  # most tokens in one flush: the 2-core machine's case
    steady = made("disagg", 0, [9.0, 0.01, 8.5, 9.5])  # one merged pair among steps
    assert burst["coalesced"] is True and burst["tpot_ms"] < 3 and steady["coalesced"] is False
    assert made("disagg", 1, [])["coalesced"] is None  # one token: no gaps to judge
    s = serve_summary_of([steady, burst, {**burst, "path": "baseline_repeat"}])
    assert s["coalesced"] == 0 and s["base_coalesced"] == 1 and s["coalesced_gap_ms"] == 0.5
    assert "streams coalesced (over half of a request's token gaps under 0.5 ms): P/D 0 of 1, baseline 1 of 1" \
        in format_serve_summary(s)


@pytest.mark.parametrize("override,message", [
    ("serve.coalesced_gap_ms=0", "serve.coalesced_gap_ms must be a number > 0"),
    ("serve.probes.interval_s=0", "serve.probes.interval_s must be > 0"),
    ("serve.probes.interval_s=1 serve.probes.max_tokens=0", "serve.probes.max_tokens must be a whole number >= 1"),
    ("serve.request_rate=0", "serve.request_rate must be > 0"),
    ("serve.max_concurrency=0", "serve.max_concurrency must be >= 1"),
    ("arrivals=gamma arrivals.burstiness=0", "arrivals: arrivals.burstiness must be > 0, got 0"),
    ("+arrivals.every=2", "arrivals: poisson() got an unexpected keyword argument 'every'"),
    ("serve.num_requests=null", "give one of serve.num_requests and serve.duration_s"),
    ("slo.ttft_ms=-5", "slo.ttft_ms must be > 0"),
    ("serve.prefill_instances=0", "serve.prefill_instances must be a whole number >= 1"),
    ("serve.baseline_instances=same", "serve.baseline_instances must be a whole number >= 1 or matched"),
    ("serve.decode_instances=2 transport.address=127.0.0.1:5555", "transport.address is where one prefill worker "
                                                                 "listens: with it runner=serve takes one prefill"),
    ("serve.endpoints.baseline=http://127.0.0.1:9", "needs both a baseline and a disagg URL"),
    ("run.no_transfer_control=true serve.endpoints.baseline=http://127.0.0.1:9 serve.endpoints.disagg=http://127.0.0.1:9",
     "run.no_transfer_control sends requests to the decode instances alone through the project's router"),
    ("serve.pd_policy=sometimes", "serve.pd_policy must be one of always, selective, got 'sometimes'"),
    ("serve.pd_policy=selective serve.selective.min_uncached_tokens=-8",
     "serve.selective.min_uncached_tokens must be an integer >= 0, got -8"),
])
@pytest.mark.slow  # in this process (conftest.refused_in_process), which then imports vLLM
def test_bad_serving_input_is_one_line_and_exit_2_before_anything_starts(tmp_path, override, message):
    run = refused_in_process(tmp_path / "serve-bad", "runner=serve", *override.split())
    lines = run.stderr.strip().splitlines()
    assert run.code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
    assert run.summary["status"] == "bad_input" and not (run.run_dir / "servers.json").exists()


@pytest.mark.slow
def test_an_unreachable_endpoint_is_exit_2(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    run = refused_in_process(tmp_path / "serve-bad", "runner=serve", f"serve.endpoints.baseline={dead}",
                             f"serve.endpoints.disagg={dead}")
    assert run.code == 2 and f"serve.endpoints.baseline {dead} does not answer" in run.stderr


# ---------------------------------------------------------------------- runner=serve end to end
README_SERVE = ("runner=serve", "strategy=fused", "serve.request_rate=8", "serve.num_requests=12",
                "serve.cancel_fraction=0.25", "slo.ttft_ms=500")


@pytest.mark.engine
def test_the_serving_runner_checks_every_request_under_load(results_dir):
    """The README's example: instances, routers, the same schedule on both paths, every output
    and digest checked, cancelled requests leave no KV held, records the loader reads; logged to
    wandb (offline) as an offline run is: its summary, every path's rows."""
    shm_before = shm_now()
    run = run_harness(results_dir / "serve-run", *README_SERVE, "tracking=wandb", "tracking.project=test",
                      env={"WANDB_SILENT": "true"})
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
    # the handover on one clock: every part stamped, adding up to the decode's first token at the client
    parts = d[HANDOVER_PARTS]
    assert parts.notna().all().all() and (parts >= 0).all().all() and (d["handover_prefill_ms"] > 0).all()
    assert ((parts.sum(axis=1) - d["decode_ttft_ms"]).abs() <= 0.05 * d["decode_ttft_ms"]).all()
    assert s["handover_requests"] == len(d) and d["base_ttft_ms"].notna().all()
    assert abs(s["handover_overhead_mean_ms"] - (d["decode_ttft_ms"].mean() - d["base_ttft_ms"].mean())) < 0.05 * abs(
        s["handover_ttft_mean_ms"])
    runs = load_runs(run.run_dir)
    assert runs.loc[0, "runner.name"] == "serve" and runs.loc[0, "ttft_ms_p50"] == s["ttft_ms_p50"]
    servers = json.loads((run.run_dir / "servers.json").read_text())
    assert set(servers) == {"baseline", "prefill", "decode", "baseline_router", "router"}
    assert left_in_shm(shm_before) == set()  # no segment left behind
    assert not any(group_alive(v["pid"]) for v in servers.values())
    (logged,) = (run.run_dir / "wandb").glob("offline-run-*/files/media/table/requests_*.table.json")
    table = json.loads(logged.read_text())
    paths = [row[table["columns"].index("path")] for row in table["data"]]
    assert sorted(set(paths)) == ["baseline", "baseline_repeat", "disagg"] and len(paths) == 36


@pytest.mark.engine
@FULL
def test_vllm_nixl_serves_behind_the_router_with_every_transfer_digested(results_dir):
    """vLLM's NixlConnector under runner=serve: the router relays the prefill instance's answer
    to the decode instance with the transfer id, and the observer beside NIXL on each instance
    (transfer_strategies/observer.py) digests the request's blocks; the negative control,
    asked through the router, is caught by those digests (make test proves both offline)."""
    nixl = ("runner=serve", "strategy=vllm_nixl", "engine.kv_cache_gib=0.25", "serve.num_requests=6",
            "serve.request_rate=inf")
    run = run_harness(results_dir / "serve-nixl", *nixl)
    assert run.code == 0, run.stderr[-3000:]
    s = run.summary
    assert s["status"] == "ok" and s["match_rate"] == 1.0 and s["requests"] == s["ok"] == 6
    rows = [r for r in load_requests(run.run_dir).to_dict("records") if r["path"] == "disagg"]
    loaded = [r for r in rows if r["blocks"] > r["skip_blocks"]]
    assert loaded and all(r["digest_match"] is True for r in loaded) and s["digest_failures"] == 0
    corrupted = run_harness(results_dir / "serve-nixl-corrupt", *nixl, "check.corrupt=true")
    assert corrupted.code == 1 and corrupted.summary["digest_failures"] >= 1, corrupted.stderr[-3000:]


@pytest.mark.engine
@FULL
def test_vllm_mooncake_serves_behind_the_router_but_not_yet_beside_the_observer(results_dir):
    """vLLM's MooncakeConnector under runner=serve: the router names the prefill instance (its
    engine id, asked of its bootstrap server) in each decode request, whose KV the prefill workers
    write; outputs match and nothing is held. Beside the observer it cannot serve yet: vLLM 0.32's
    MultiConnector asserts that every connector reporting transfer stats has Prometheus metrics,
    which MooncakeConnector has not, and the instance's output handler dies at the first stats
    (vllm-project/vllm#43828, fix proposed in #43836). This test fails once a vLLM fixes it: then
    vllm_mooncake is judged by digests under runner=serve too."""
    mooncake = ("runner=serve", "strategy=vllm_mooncake", "engine.kv_cache_gib=0.25", "serve.num_requests=4",
                "serve.request_rate=inf", "serve.baseline_repeat=false")
    run = run_harness(results_dir / "serve-mooncake", *mooncake, "check.digests=false")
    assert run.code == 0, run.stderr[-3000:]
    s = run.summary
    assert s["status"] == "ok" and s["match_rate"] == 1.0 and s["requests"] == s["ok"] == 4
    assert s["kv_cache_usage_at_end"] == {"prefill": 0.0, "decode": 0.0}
    shm_before = shm_now()
    observed = run_harness(results_dir / "serve-mooncake-observed", *mooncake)
    assert observed.code == 3, observed.stderr[-3000:]
    logs = "".join((observed.run_dir / f"{name}.log").read_text() for name in ("prefill", "decode"))
    assert "MooncakeConnector is not contained in the list of registered connectors" in logs
    assert left_in_shm(shm_before) == set()  # what the instance whose engine died had mapped too


@pytest.mark.engine
@FULL
def test_the_fault_and_abort_scenarios_run_through_the_router(results_dir):
    """runner=serve scenario=aborts with every 3rd prompt's transfer dropped: the client asks the
    router for the fault (X-KV-Fault) and abandons half the requests at random times; each dropped
    transfer's request fails at the transfer timeout with the decode worker's reason, every other
    request matches, and nothing stays held."""
    run = run_harness(results_dir / "serve-scenarios", "runner=serve", "scenario=aborts",
                      "scenario.fault={kind:drop,every:3}", "serve.num_requests=16", "serve.request_rate=8",
                      "serve.baseline_repeat=false")
    assert run.code == 0, run.stderr[-3000:]
    s = run.summary
    assert s["faults_injected"] == s["faults_caught"] >= 1 and s["faults_missed"] == 0
    assert s["aborted"] == s["cancelled"] >= 4 and s["kv_cache_usage_at_end"] == {"prefill": 0.0, "decode": 0.0}
    df = load_requests(run.run_dir)
    d = df[df["path"] == "disagg"]
    faulted = d[d["fault"] == "drop"]
    assert (faulted["prompt_idx"] % 3 == 2).all() and len(faulted) == len(d[d["prompt_idx"] % 3 == 2])
    caught = faulted[faulted["aborted"].isna()]
    assert (caught["status"] == "failed").all() and caught["transfer_error"].str.startswith("no KV arrived").all()
    clean = d[d["fault"].isna() & d["aborted"].isna()]
    assert (clean["status"] == "ok").all() and clean["match"].all() and clean["digest_match"].all()
    assert (d.loc[d["aborted"] == "client", "status"] == "cancelled").all()


def group_alive(pid: int) -> bool:
    return bool(process_group.members(pid))


README_SERVE_2P1D = ("runner=serve", "strategy=fused", "serve.prefill_instances=2", "serve.stream_prefill_token=true",
                     "serve.request_rate=8", "serve.num_requests=12", "serve.cancel_fraction=0.25",
                     "serve.baseline_instances=matched")


@pytest.mark.engine
@FULL
def test_two_prefill_instances_and_the_prefill_token_streamed(results_dir):
    """docs/serving.md's 2P1D example: both prefill instances serve, every transfer is checked, the
    client's TTFT is the prefill's answer, the decode's first token is recorded beside it; the
    baseline on as many instances as the P/D side (matched: 3), each of which serves."""
    run = run_harness(results_dir / "serve-2p1d", *README_SERVE_2P1D)
    assert run.code == 0, run.stderr[-3000:]
    s = run.summary
    assert s["status"] == "ok" and s["failed"] == 0 and s["cancelled"] >= 1 and s["match_rate"] == 1.0
    assert s["digest_checked"] == s["ok"] and s["digest_failures"] == 0
    assert s["kv_cache_usage_at_end"] == {"prefill0": 0.0, "prefill1": 0.0, "decode": 0.0}
    servers = json.loads((run.run_dir / "servers.json").read_text())
    assert set(servers) == {"baseline0", "baseline1", "baseline2", "prefill0", "prefill1", "decode", "baseline_router",
                            "router"}
    assert s["instances"] == {"baseline": 3, "prefill": 2, "decode": 1}
    # round robin: every baseline instance answered its share (vLLM logs each completion it serves)
    assert all("POST /v1/completions" in (run.run_dir / f"baseline{i}.log").read_text() for i in range(3))
    assert all(len(read_jsonl(run.run_dir / f"prefill{i}-transfers.jsonl")) >= 4 for i in (0, 1))
    df = load_requests(run.run_dir)
    d = df[(df["path"] == "disagg") & (df["status"] == "ok")]
    # the prefill's token is the client's first: it arrives right after the router's mark
    assert (d["prefill_ttft_ms"] <= d["ttft_ms"]).all() and d["decode_ttft_ms"].notna().all()
    assert d["match"].all() and d["digest_match"].all()
    b = df[df["path"] == "baseline"]
    assert b["prefill_ttft_ms"].isna().all() and b["decode_ttft_ms"].isna().all()  # no P/D, no marks
    assert s["prefill_ttft_ms_p50"] <= s["ttft_ms_p50"] and s["decode_ttft_ms_p50"] > 0


README_SERVE_2P2D = ("runner=serve", "strategy=layerwise", "serve.prefill_instances=2", "serve.decode_instances=2",
                     "serve.prefill_policy=least_outstanding", "serve.request_rate=8", "serve.num_requests=12")


@pytest.mark.engine
@FULL
@pytest.mark.parametrize("shape", ["1P2D", "2P2D"])
def test_layerwise_pushes_each_request_to_the_decode_instance_the_router_chose(results_dir, shape):
    """xPyD with a push strategy that sends from inside the forward pass: each prefill worker has
    a KV channel to each decode instance and sends every layer of a request to the one the router
    chose for it (transport/fan_out.py); every output and digest checked, nothing held, nothing
    left. 2P2D picks the prefill instance by fewest outstanding requests, so that the pairs mix
    (round robin on both sides pairs prefill i with decode i; tests/test_serve_deployment.py
    covers every pair with fused)."""
    p, n = int(shape[0]), int(shape[2])
    one_prefill = ("runner=serve", "strategy=layerwise", "serve.decode_instances=2", "serve.request_rate=8",
                   "serve.num_requests=12")
    overrides = README_SERVE_2P2D if shape == "2P2D" else one_prefill
    shm_before = shm_now()
    run = run_harness(results_dir / f"serve-layerwise-{shape}", *overrides, "serve.baseline_repeat=false")
    assert run.code == 0, run.stderr[-3000:]
    s = run.summary
    assert s["status"] == "ok" and s["ok"] == 12 and s["match_rate"] == 1.0
    assert s["digest_checked"] == 12 and s["digest_failures"] == 0
    names = [f"prefill{i}" for i in range(p)] if p > 1 else ["prefill"]
    names += [f"decode{i}" for i in range(n)]
    assert s["kv_cache_usage_at_end"] == dict.fromkeys(names, 0.0)
    received = [read_jsonl(run.run_dir / f"decode{i}-transfers.jsonl") for i in range(n)]
    assert all(len(r) >= 5 for r in received)  # round robin over the decode instances, 6 each (warm-up aside)
    layers = json.loads((ROOT / "models" / "tiny-llama" / "config.json").read_text())["num_hidden_layers"]
    assert all(r["error"] is None and r["messages"] == layers for rs in received for r in rs)  # a message a layer
    servers = json.loads((run.run_dir / "servers.json").read_text())
    assert not any(group_alive(v["pid"]) for v in servers.values())
    assert left_in_shm(shm_before) == set()


@pytest.mark.engine
@FULL
@pytest.mark.parametrize("shape", ["1P1D", "2P2D"])
def test_tensor_parallel_prefill_instances_serve_decode_instances_of_another_degree(results_dir, shape):
    """runner=serve with tensor parallelism: prefill instances of TP 2 (a worker per KV head) and
    decode instances of TP 1 that join both workers' heads; every output and every head's digests
    checked, as offline. 2P2D: each prefill worker holds a sharded channel to each decode instance
    and sends a request to the one the router chose. The prefill instance is picked by prefix hash
    (the instances' ports in the hash: pairs vary from run to run, mixed most times), the decode
    instance by round robin; tests/test_tp.py sends over every pair without engines."""
    p, n = int(shape[0]), int(shape[2])
    more = ["serve.prefill_instances=2", "serve.decode_instances=2", "serve.prefill_policy=prefix_hash"] \
        if shape == "2P2D" else []
    shm_before = shm_now()
    run = run_harness(results_dir / f"serve-tp-{shape}", "runner=serve", "strategy=fused",
                      "engines.prefill={tensor_parallel_size:2}", "serve.request_rate=4", "serve.num_requests=8",
                      "serve.baseline_repeat=false", *more)
    assert run.code == 0, run.stderr[-3000:]
    s = run.summary
    assert s["status"] == "ok" and s["ok"] == 8 and s["match_rate"] == 1.0
    assert s["digest_checked"] == 8 and s["digest_failures"] == 0
    prefill = [f"prefill{i}" for i in range(p)] if p > 1 else ["prefill"]
    decode = [f"decode{i}" for i in range(n)] if n > 1 else ["decode"]
    assert s["kv_cache_usage_at_end"] == dict.fromkeys(prefill + decode, 0.0)
    sent = [len(read_jsonl(run.run_dir / f"{name}-transfers{rank}.jsonl"))
            for name in prefill for rank in ("", ".rank1")]
    received = [len(read_jsonl(run.run_dir / f"{name}-transfers.jsonl")) for name in decode]
    assert sent[0::2] == sent[1::2] and sum(sent[0::2]) == sum(received)  # each prefill worker sends each request
    assert all(received)  # round robin over the decode instances
    servers = json.loads((run.run_dir / "servers.json").read_text())
    assert not any(group_alive(v["pid"]) for v in servers.values())
    assert left_in_shm(shm_before) == set()


@pytest.mark.engine
@FULL
def test_a_request_past_its_time_limit_is_recorded_as_failed_and_the_run_goes_on(results_dir):
    """run.request_timeout_s shorter than a request takes: each such request is failed with its
    reason, counted, and the run still ends normally with no KV held (the router aborted them
    upstream); the warm-up is not held to it."""
    run = run_harness(results_dir / "serve-timeout", "runner=serve", "serve.num_requests=6", "serve.request_rate=inf",
                      "serve.baseline_repeat=false", "sampling.max_tokens=256", "run.request_timeout_s=0.3")
    assert run.code == 0, run.stderr[-3000:]
    s = run.summary
    assert s["timed_out"] >= 1 and s["failed"] == s["timed_out"] and s["slo_attainment"] < 1
    df = load_requests(run.run_dir)
    failed = df[df["status"] == "failed"]
    assert len(failed) == s["timed_out"] + s["base_timed_out"] and (failed["error"] == TIMED_OUT).all()
    assert s["kv_cache_usage_at_end"] == {"prefill": 0.0, "decode": 0.0}


@pytest.mark.engine
@FULL
def test_an_instance_that_dies_stops_the_run_with_exit_3_keeping_its_records(results_dir):
    run_dir = results_dir / "serve-death"
    shutil.rmtree(run_dir, ignore_errors=True)
    shm_before = shm_now()
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
    # vLLM's shared memory of the killed instance (and of the others) is gone with them; a
    # 32-byte semaphore of the killed process may stay (sem.mp-*: only it had it mapped)
    assert {f for f in left_in_shm(shm_before) if not f.startswith("sem.mp-")} == set()


@pytest.mark.engine
@FULL
def test_the_router_benchmark_runs_as_the_readme_shows(results_dir):
    out = results_dir / "bench-router"
    shutil.rmtree(out, ignore_errors=True)
    p = subprocess.run([sys.executable, "scripts/bench_router.py", "--requests", "4", "--prompt-len", "32",
                        "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.loads((out / "router.json").read_text())
    assert result["requests"] == len(result["pairs"]) == 4 and "router adds" in p.stdout
    assert all(pair["router_ttft_ms"] > 0 and pair["direct_ttft_ms"] > 0 for pair in result["pairs"])


@SLOW  # in this process, which then imports vLLM (as a subprocess: about 12 s more)
def test_the_crosscheck_benchmark_refuses_bad_input_before_starting_anything(results_dir, capsys):
    out = results_dir / "bench-crosscheck-bad"
    shutil.rmtree(out, ignore_errors=True)
    main = runpy.run_path(str(ROOT / "scripts" / "bench_crosscheck.py"))["main"]
    argv = ["scripts/bench_crosscheck.py", "--prompt-len", "2048", "--max-tokens", "64", "--out", str(out)]
    with mock.patch.object(sys, "argv", argv), \
            mock.patch("harness.serving.instances.instance_behind_router", side_effect=AssertionError("started")):
        code = main()
    assert code == 2 and capsys.readouterr().err.strip().splitlines()[-1].startswith("error: prompt 0")
    assert not out.exists()


@pytest.mark.engine
@FULL
def test_the_crosscheck_benchmark_runs_as_the_readme_shows(results_dir):
    """The same cross-check as tests/test_serve_deployment.py, on an instance of the script's own
    (its prefix cache off); the figures' agreement is that test's to check."""
    out = results_dir / "bench-crosscheck"
    shutil.rmtree(out, ignore_errors=True)
    # the harness's measured pass (about 10 s) outlasts vLLM's client's start (about 4 s) and run
    p = subprocess.run([sys.executable, "scripts/bench_crosscheck.py", "--requests", "64", "--vllm-requests", "4",
                        "--prompt-len", "128", "--max-tokens", "32", "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.loads((out / "crosscheck.json").read_text())
    assert result["outputs_match"] and result["vllm_requests"] == 4 and result["harness_requests"] == 64
    assert result["harness_requests_during"] >= 1 and result["tpot_ms_ratio"] > 0 and "ttft_ms p50" in p.stdout


@pytest.mark.parametrize("override,message", [
    ("serve.decode_instances=2 transport.address=127.0.0.1:5555", "got 1P2D"),
    ("serve.endpoints.disagg=http://127.0.0.1:9", "starts a deployment"),
    ("serve.prefill_instances=0", "serve.prefill_instances must be a whole number >= 1"),
])
def test_deploy_refuses_bad_input_with_one_line_and_exit_2_before_anything_starts(tmp_path, capsys, override,
                                                                                  message):
    from harness.serving.deploy import deploy

    cfg = compose_config("runner=serve", "device=cpu", *override.split())
    assert deploy(cfg, tmp_path / "d") == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "d" / "servers.json").exists()


def test_each_instance_starts_on_its_sides_gpu_plus_its_place_times_its_tp_degree():
    """device.<role>_gpu is the side's first GPU; instance i's workers start i x TP degree past it."""
    from harness.settings import first_gpu

    cfg = settle(compose_config("runner=serve", "serve.prefill_instances=2", "engines.prefill={tensor_parallel_size:2}",
                                "device.decode_gpu=4"), "cuda")
    assert [first_gpu(cfg, "prefill", i) for i in range(2)] == [0, 2]
    assert [first_gpu(cfg, "decode", i) for i in range(2)] == [4, 5]
    assert [first_gpu(cfg, "baseline", i) for i in range(3)] == [0, 1, 2]


def test_both_instances_get_the_client_request_id_as_vllms_proxy_sends_it():
    """vLLM's NIXL push connector pairs a decode request with its prefill request by the request id
    (vllm serve takes it from X-Request-Id): the router sends the transfer id as that header to both
    instances, with every handoff. A bootstrap handoff (vLLM's Mooncake connector) names the prefill
    instance in the decode request: the engine id its bootstrap server gives, asked once."""
    import asyncio

    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    async def run(handoff: str) -> tuple[list, dict, int, str]:
        seen, decode_params, queries = [], {}, []

        async def instance(request: web.Request) -> web.Response:
            body = await request.json()
            seen.append((body["max_tokens"], request.headers.get("X-Request-Id")))
            if body["max_tokens"] > 1:
                decode_params.update(body["kv_transfer_params"])
            return web.json_response({"choices": [{"text": "x"}], "kv_transfer_params": {"remote_block_ids": [[1]]}})

        async def query(request: web.Request) -> web.Response:  # Mooncake's bootstrap server
            queries.append(1)
            return web.json_response({"0": {"engine_id": "prefill-9", "worker_addr": {}}})

        upstream = web.Application()
        upstream.router.add_post("/v1/completions", instance)
        upstream.router.add_get("/query", query)
        async with TestServer(upstream) as up:
            url = str(up.make_url("")).rstrip("/")
            router = Router([url], [url], handoff=handoff, decode_submit="after_prefill",
                            bootstrap=[url] if handoff == "bootstrap" else None)
            async with TestClient(TestServer(router.app())) as client:
                for _ in range(2):
                    r = await client.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 4},
                                          headers={"X-Request-Id": "req-7"})
                    assert r.status == 200 and r.headers["X-Transfer-Id"] == "req-7"
        return seen, decode_params, len(queries), url

    for handoff in ("push", "relay", "bootstrap"):
        seen, params, queries, url = asyncio.run(run(handoff))
        assert sorted(seen) == [(1, "req-7")] * 2 + [(4, "req-7")] * 2 and params["transfer_id"] == "req-7"
    assert params["remote_engine_id"] == "prefill-9" and params["do_remote_prefill"] is True and queries == 1
    assert params["remote_bootstrap_addr"] == url
    with pytest.raises(ValueError, match="a --bootstrap URL for each --prefill"):
        Router(["http://p"], ["http://d"], handoff="bootstrap")
