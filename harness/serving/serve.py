"""runner=serve: the strategy under load, the way it is deployed (issue 13).

    python -m harness runner=serve strategy=fused serve.request_rate=4 slo.ttft_ms=500

    baseline instance -> router ---+                     the same arrival schedule (serve.seed),
                                   +-- load generator -- sent to the baseline (twice: its own
    prefill + decode  -> router ---+   (serving/load.py)  noise), then to the P/D router

The baseline, prefill and decode engines are `vllm serve` instances (serving/instances.py,
started by serving/deployment.py) with the offline runner's engine arguments and connector
configuration (harness/engine_config.py); both paths go through the project's router
(serving/router.py), so that they pay the same proxy hop. With
serve.endpoints.baseline and serve.endpoints.disagg it starts nothing and measures a deployment
that is already running (no transfer records there).

Every request of every path is checked: its output token ids against the baseline's for the
same request, and on the P/D path the connectors' digests of its KV. Records: meta.json,
baseline.jsonl and requests.jsonl (schema.ServeRow), summary.json (records/serve_summary.py).
Exit codes as the offline runner's: 0, 1 (outputs differ beyond the baseline's own noise, a
digest or transfer failure, KV left held), 2 bad input, 3 an instance died, 130 interrupted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import queue
import random
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf

from harness import scenario
from harness.checks import ConfigError, checked_inputs, decode_submit, stored_kv_dtype
from harness.engine_config import pulls, tp_degrees
from harness.records.accuracy import task_score
from harness.records.compare import compare_outputs
from harness.records.files import JsonlWriter, read_jsonl, write_json
from harness.records.join import kv_gated, path_parts, record_stamps, transfer_fields
from harness.records.meta import versions
from harness.records.schema import HANDOVER_PATH, ServeRow
from harness.records.serve_summary import coalesced, serve_summary
from harness.records.tables import format_serve_summary
from harness.records.transfer_records import TransferStats
from harness.records.verdict import ended_early
from harness.serving.arrivals import build as build_arrivals
from harness.serving.deployment import ServingDeployment, instance_counts
from harness.serving.instances import InstanceDied
from harness.serving.load import ClientResult, LoadError, LoadSpec, ScheduledRequest, arrival_schedule, send_all
from harness.serving.router import POLICIES
from harness.tracking import track
from harness.workload import ANY_VOCAB, Prompt, Workload, WorkloadError, warmup_workload


def load_spec(cfg: DictConfig) -> LoadSpec:
    s = cfg.serve
    return LoadSpec(request_rate=float(s.request_rate), arrivals=build_arrivals(cfg.arrivals),
                    num_requests=s.num_requests, duration_s=s.duration_s, max_concurrency=s.max_concurrency,
                    seed=s.seed, cancel_fraction=float(s.cancel_fraction), ramp_up=s.ramp_up,
                    ramp_up_start_rps=s.ramp_up_start_rps, ramp_up_end_rps=s.ramp_up_end_rps)


def check_serve_inputs(cfg: DictConfig) -> None:
    load_spec(cfg).check()
    for key in ("ttft_ms", "tpot_ms"):
        v = cfg.slo.get(key)
        if v is not None and not v > 0:
            raise LoadError(f"slo.{key} must be > 0 (null: no limit), got {v}")
    probes = cfg.serve.probes
    if probes.interval_s is not None:
        if isinstance(probes.interval_s, bool) or not isinstance(probes.interval_s, int | float) \
                or not probes.interval_s > 0:
            raise LoadError(f"serve.probes.interval_s must be > 0 (null: no probes), got {probes.interval_s!r}")
        for key in ("prompt_len", "max_tokens"):
            if not isinstance(probes[key], int) or isinstance(probes[key], bool) or probes[key] < 1:
                raise LoadError(f"serve.probes.{key} must be a whole number >= 1, got {probes[key]!r}")
        if probes.prompt_len + probes.max_tokens > cfg.engine.max_model_len:
            raise LoadError(f"serve.probes: {probes.prompt_len} + {probes.max_tokens} tokens exceed "
                            f"engine.max_model_len={cfg.engine.max_model_len}")
    reps = cfg.serve.repeats
    if not isinstance(reps, int) or isinstance(reps, bool) or reps < 1:
        raise LoadError(f"serve.repeats must be a whole number >= 1, got {reps!r}")
    gap = cfg.serve.coalesced_gap_ms
    if isinstance(gap, bool) or not isinstance(gap, int | float) or not gap > 0:
        raise LoadError(f"serve.coalesced_gap_ms must be a number > 0, got {gap!r}")
    check_instances(cfg)
    ends = cfg.serve.endpoints
    if (ends.baseline is None) != (ends.disagg is None):
        raise LoadError("serve.endpoints needs both a baseline and a disagg URL (or neither: the harness "
                        "starts its own instances)")


def check_instances(cfg: DictConfig) -> None:
    """Each side's instance count and the routers' policies (runner=serve and python -m harness.serving.deploy)."""
    for key in ("policy", "prefill_policy"):
        v = cfg.serve.get(key)
        if not (v in POLICIES or key == "prefill_policy" and v is None):
            raise LoadError(f"serve.{key} must be one of {', '.join(POLICIES)}"
                            f"{' (or null: serve.policy)' if key == 'prefill_policy' else ''}, got {v!r}")
    for side in ("baseline", "prefill", "decode"):
        n = cfg.serve[f"{side}_instances"]
        if (not isinstance(n, int) or isinstance(n, bool) or n < 1) and not (side == "baseline" and n == "matched"):
            raise LoadError(f"serve.{side}_instances must be a whole number >= 1"
                            f"{' or matched' if side == 'baseline' else ''}, got {n!r}")
    pairs = cfg.serve.prefill_instances * cfg.serve.decode_instances
    if pairs > 1 and cfg.transport.get("address") and not pulls(cfg.strategy):
        raise LoadError(f"transport.address is where one prefill worker listens: with it runner=serve takes one "
                        f"prefill and one decode instance, got {cfg.serve.prefill_instances}P"
                        f"{cfg.serve.decode_instances}D")


def probe_schedule(cfg: DictConfig, schedule: list[ScheduledRequest]) -> tuple[list[ScheduledRequest], list[Prompt]]:
    """serve.probes: a short request every interval_s from the load's first arrival to its last,
    each its own seeded random prompt (no prefix cache serves it), the same on both paths."""
    p = cfg.serve.probes
    if not p.interval_s:
        return [], []
    rng = random.Random(cfg.serve.seed + 2)
    n = math.floor(max(r.arrival_s for r in schedule) / p.interval_s + 1e-9) + 1  # 0.7 // 0.1 is 6.0
    prompts = [Prompt(i, [rng.randrange(*ANY_VOCAB) for _ in range(p.prompt_len)]) for i in range(n)]
    return [ScheduledRequest(i, i, q.token_ids, i * p.interval_s, max_tokens=p.max_tokens)
            for i, q in enumerate(prompts)], prompts


def check_endpoints(cfg: DictConfig) -> None:
    """Endpoints the user brings answer (after every check that needs no network)."""
    ends = cfg.serve.endpoints
    if ends.baseline is not None:
        for name in ("baseline", "disagg"):
            url = ends[name].rstrip("/")
            try:
                with urllib.request.urlopen(url + "/v1/models", timeout=10) as r:
                    r.read()
            except (urllib.error.URLError, OSError) as e:
                raise LoadError(f"serve.endpoints.{name} {url} does not answer /v1/models ({e})") from None


def request_schedule(spec: LoadSpec, workload: Workload) -> list[ScheduledRequest]:
    """The arrival schedule of the workload's prompts. A multi-turn workload's arrivals are its
    conversations (their first turns, used in order as prompts are), each followed by its later
    turns, due at the conversation's arrival but each sent once the previous turn has ended."""
    if workload.prompts[0].arrival_s is not None:  # a trace: its own arrivals and output lengths
        cancels = np.random.default_rng(spec.seed + 1).random(len(workload.prompts)) < spec.cancel_fraction
        return [ScheduledRequest(i, p.index, list(p.token_ids), p.arrival_s, bool(c), max_tokens=p.max_tokens)
                for i, (p, c) in enumerate(zip(workload.prompts, cancels, strict=True))]
    firsts = [p for p in workload.prompts if p.follows is None]
    arrivals = arrival_schedule(spec, [p.token_ids for p in firsts])
    if len(firsts) == len(workload.prompts):
        return arrivals
    after = {p.follows: p for p in workload.prompts if p.follows is not None}
    schedule: list[ScheduledRequest] = []
    for a in arrivals:
        p, follows = firsts[a.prompt_idx], None
        while p is not None:
            schedule.append(ScheduledRequest(len(schedule), p.index, list(p.token_ids), a.arrival_s, a.cancel,
                                             follows))
            follows, p = len(schedule) - 1, after.get(p.index)
    return schedule


def check_serve_workload(cfg: DictConfig, spec: LoadSpec, workload: Workload) -> None:
    if any(p.follows is not None for p in workload.prompts):
        abandoning = {"serve.cancel_fraction": spec.cancel_fraction, "scenario.aborts": cfg.scenario.get("aborts")}
        for name, on in abandoning.items():
            if on:
                raise LoadError(f"{name} with workload {workload.name!r}: a cancelled turn has no answer for its "
                                f"conversation's next turn to continue")


def scenario_schedule(cfg: DictConfig, schedule: list[ScheduledRequest], workload: Workload
                      ) -> list[ScheduledRequest]:
    """The P/D path's schedule with the scenario's faults and aborts: the transfer of every request
    of a faulted prompt (harness/scenario.py fault_for, as offline) carries the fault; a share of the
    requests (scenario.aborts.fraction, seeded by serve.seed) is abandoned by the client at a
    random time in its first max_delay_ms, during its prefill, its transfer or its decode."""
    abandon = scenario.client_aborts(cfg, len(schedule))
    return [dataclasses.replace(r, fault=scenario.fault_for(cfg, workload.prompts[r.prompt_idx]),
                                abort_after_s=abandon[i]) for i, r in enumerate(schedule)]


def run_facts(cfg: DictConfig, run_id: str, device: str, external: bool) -> dict:
    """What the run was, as summary.json states it (harness/records/serve_summary.py)."""
    trace = cfg.workload.get("_target_") == "harness.workload.trace"
    return {"run_id": run_id, "strategy": cfg.strategy.name, "model": cfg.model.name, "workload": cfg.workload.name,
            "device": device, "external_endpoints": external, "request_rate": float(cfg.serve.request_rate),
            "arrivals": cfg.arrivals.name,
            "trace": {"path": cfg.workload.path, "time_scale": cfg.workload.time_scale} if trace else None,
            "ramp_up": None if cfg.serve.ramp_up is None else {
                "strategy": cfg.serve.ramp_up, "start_rps": cfg.serve.ramp_up_start_rps,
                "end_rps": cfg.serve.ramp_up_end_rps},
            "max_concurrency": cfg.serve.max_concurrency, "instances": None if external else instance_counts(cfg),
            "slo": {"ttft_ms": cfg.slo.ttft_ms, "tpot_ms": cfg.slo.tpot_ms}, "kv_cache_dtype": stored_kv_dtype(cfg),
            "coalesced_gap_ms": cfg.serve.coalesced_gap_ms}


def served_model(cfg: DictConfig) -> str:
    return cfg.serve.model_name or str(cfg.model.path)


def ms(t: float | None) -> float | None:
    return None if t is None else t * 1e3


def row(cfg, run_id: str, device: str, path: str, r: ClientResult, p: Prompt, base: ClientResult | None,
        stats: TransferStats | None, rate: float, repeat: int = 0) -> dict:
    ok = r.status == "ok"
    ttft = r.t_first * 1e3 if r.t_first is not None else None
    e2e = r.t_done * 1e3 if ok else None
    tpot = (e2e - ttft) / (len(r.token_ids) - 1) if ok and len(r.token_ids) > 1 else None
    itl = [(b - a) * 1e3 for a, b in zip(r.token_times, r.token_times[1:])]
    bursts = coalesced(itl, cfg.serve.coalesced_gap_ms) if ok else None
    meets = None
    if ok:
        meets = all(limit is None or value is not None and value <= limit
                    for value, limit in ((ttft, cfg.slo.ttft_ms), (tpot, cfg.slo.tpot_ms)))
    cmp = None
    if ok and base is not None and base.status == "ok":
        cmp = compare_outputs(base.token_ids, r.token_ids, base.logprobs, r.logprobs, base.top_ids, r.top_ids)
    send = recv = digest_match = None
    joined = transfer_fields(None, None, None)
    if stats is not None and r.transfer_id:
        # a request the client abandoned may have left before its KV was taken: no receive record to wait for
        send, recv, digest_match = stats.take_transfer(r.transfer_id, received=r.status == "ok")
        joined = transfer_fields(send, recv, digest_match, stats.take(r.transfer_id, "prefill"),
                                 stats.take(r.transfer_id, "decode"))
    parts = handover(cfg, r, send, recv) if ok and path.startswith("disagg") else None
    return ServeRow(
        **ServeRow.known(joined),
        run_id=run_id, strategy=cfg.strategy.name, model=cfg.model.name, workload=cfg.workload.name, device=device,
        path=path, request_idx=r.index, prompt_idx=r.prompt_idx, prompt_len=r.prompt_len,
        output_len=len(r.token_ids), conversation=p.conversation, turn=p.turn, status=r.status, error=r.error,
        request_rate=rate, arrival_s=r.arrival_s,
        sent_s=r.t_sent, ttft_ms=ttft, prefill_ttft_ms=ms(r.t_prefill_token), decode_ttft_ms=ms(r.t_decode_token),
        tpot_ms=tpot, e2e_ms=e2e, itl_ms=itl, coalesced=bursts, meets_slo=meets,
        match=cmp.match if cmp else None, first_divergence=cmp.first_divergence if cmp else None,
        max_logprob_diff=cmp.max_logprob_diff if cmp else None, near_tie=cmp.near_tie if cmp else None,
        transfer_id=r.transfer_id, repeat=repeat,
        base_ttft_ms=(base.t_first * 1e3 if path.startswith("disagg") and base is not None and base.t_first is not None
                      else None),
        **{f"handover_{part}_ms": parts[part] if parts else None for part, _ in HANDOVER_PATH},
        token_ids=r.token_ids, fault=r.fault, aborted="client" if r.aborted else None,
        task_score=task_score(r.token_ids, p.reference) if ok else None)


def handover(cfg, r: ClientResult, send, recv) -> dict[str, float] | None:
    """The P/D request's time to the decode instance's first token at the client, cut along
    HANDOVER_PATH on one clock: the client's, the router's `routed` stamp and the connectors'
    records (harness/records/join.py path_parts). None where a stamp is missing (vLLM's connectors,
    endpoints not through the project's router) or where the KV did not gate the first token."""
    first = r.t_decode_token if r.t_decode_token is not None else None if cfg.serve.stream_prefill_token else r.t_first
    if r.t_origin is None or r.t_routed is None or first is None:
        return None
    t = {f"t_{e}_ms": None if v is None else (v - r.t_origin) * 1e3 for e, v in record_stamps(send, recv).items()}
    t.update(t_routed_ms=r.t_routed * 1e3, t_first_token_ms=first * 1e3)
    return path_parts(t, HANDOVER_PATH, kv_gates_first_token=kv_gated(decode_submit(cfg) == "early", recv))


class RowWriter:
    """Writes each request's row as soon as it ends, so that a run stopped halfway keeps what it
    measured. A thread of its own: a P/D row waits (up to wait_s) for its transfer records,
    which the workers append a moment after the client has its answer (a faulted request's
    even when it failed: they say why)."""

    def __init__(self, out: JsonlWriter, make_row, stats: TransferStats | None, wait_s: float = 5.0):
        self.out, self.make_row, self.stats, self.wait_s = out, make_row, stats, wait_s
        self.queue: queue.Queue = queue.Queue()
        self.abandon = threading.Event()  # the run is stopping: no more waiting for records
        self.thread = threading.Thread(target=self._loop, name="row-writer", daemon=True)
        self.thread.start()

    def put(self, result: ClientResult) -> None:
        self.queue.put(result)

    def _loop(self) -> None:
        while (r := self.queue.get()) is not None:
            if self.stats is not None and r.transfer_id and (r.status == "ok" or r.fault):
                deadline = time.monotonic() + self.wait_s
                while not self.stats.has_both(r.transfer_id) and time.monotonic() < deadline \
                        and not self.abandon.is_set():
                    time.sleep(0.01)
            self.out.write(self.make_row(r))

    def close(self, abandon: bool = False) -> None:
        if abandon:
            self.abandon.set()
        self.queue.put(None)
        self.thread.join()


def run(cfg: DictConfig, run_dir: Path) -> int:
    run_dir.mkdir(parents=True, exist_ok=True)
    run_id = run_dir.name
    t_run = time.monotonic()
    try:
        check_serve_inputs(cfg)
        device, workload = checked_inputs(cfg)
        check_serve_workload(cfg, load_spec(cfg), workload)
        check_endpoints(cfg)
    except (ConfigError, WorkloadError, LoadError) as e:
        print(f"error: {e}", file=sys.stderr)
        write_json(run_dir / "summary.json", {"status": "bad_input", "error": str(e), "run_id": run_id})
        return 2

    spec = load_spec(cfg)
    schedule = request_schedule(spec, workload)
    probes, probe_prompts = probe_schedule(cfg, schedule)
    meta = {"run_id": run_id, "runner": "serve", "versions": versions(device), "strategy": cfg.strategy.name,
            "decode_submit": decode_submit(cfg), "model": cfg.model.name, "workload": cfg.workload.name,
            "num_prompts": len(workload.prompts), "num_requests": len(schedule),
            "config": OmegaConf.to_container(cfg, resolve=True)}
    write_json(run_dir / "meta.json", meta)
    deployment = ServingDeployment(cfg, device, run_dir)
    status, code, error = "ok", 0, None
    timings: dict = {}
    kv_usage = {}
    tag = uuid.uuid4().hex[:6]
    base_out, req_out = JsonlWriter(run_dir / "baseline.jsonl"), JsonlWriter(run_dir / "requests.jsonl")
    probe_out = JsonlWriter(run_dir / "probes.jsonl") if probes else None
    # each engine's workers write a record file each
    stats = None if deployment.external else TransferStats(*deployment.stats_paths, tp=tp_degrees(cfg),
                                                           prefill_engines=len(deployment.prefill_names))
    rate = (f"{spec.request_rate} req/s" if spec.ramp_up is None else
            f"{spec.ramp_up_start_rps} to {spec.ramp_up_end_rps} req/s ({spec.ramp_up} ramp-up)")
    if workload.prompts[0].arrival_s is not None:
        rate = f"the trace's times ({cfg.workload.path}, time scale {cfg.workload.time_scale})"
    model = served_model(cfg)

    def sending(path: str, url: str, reqs, on_result, timeout_s: float, limit: int | None):
        return send_all(url, model, reqs, max_tokens=cfg.sampling.max_tokens, max_concurrency=limit,
                        timeout_s=timeout_s, id_prefix=f"{tag}-{path}", logprobs=cfg.sampling.logprobs,
                        on_result=on_result, watchdog=None if deployment.external else deployment.watchdog,
                        turn_ids=lambda req: workload.prompts[req.prompt_idx].token_ids)

    def load(path: str, url: str, reqs, on_result=None, timeout_s=cfg.run.request_timeout_s, on_probe=None):
        """The load's requests on one path, with the probes beside them where on_probe takes them."""
        if on_probe is None:
            return asyncio.run(sending(path, url, reqs, on_result, timeout_s, spec.max_concurrency))

        async def beside():
            results, _ = await asyncio.gather(sending(path, url, reqs, on_result, timeout_s, spec.max_concurrency),
                                              sending(f"{path}-probe", url, probes, on_probe, timeout_s, None))
            return results
        return asyncio.run(beside())

    try:
        print(f"[harness] {run_id}: serving {len(schedule)} requests at {rate} ({cfg.arrivals.name}), "
              f"strategy={cfg.strategy.name}, model={cfg.model.name}, device={device}; logs in {run_dir}", flush=True)
        t0 = time.monotonic()
        deployment.start(cfg.run.startup_timeout_s)
        timings["startup_s"] = time.monotonic() - t0
        if cfg.run.warmup_requests:  # first use of each path (the connector's included) is not measured
            t0 = time.monotonic()
            # every instance's first use: as many at once as the largest side has instances (round
            # robin and least outstanding both spread requests sent together)
            # and none of the measured prompts' tokens, which a prefix cache would keep (warmup_workload)
            sides = tuple(instance_counts(cfg).values())
            warm = [ScheduledRequest(i, p.index, p.token_ids, 0.0)
                    for i, p in enumerate(warmup_workload(workload, cfg.run.warmup_requests * max(sides)).prompts)]
            for path in ("baseline", "disagg"):
                # first use (the connector's buffers, compilation) may take far longer than a request may
                for r in load(f"warmup-{path}", deployment.urls[path], warm, timeout_s=cfg.run.startup_timeout_s):
                    if r.status != "ok":
                        raise InstanceDied(f"warm-up request through the {path} path failed: {r.error}")
            timings["warmup_s"] = time.monotonic() - t0
        # serve.repeats: the same schedule again on each path, interleaved (drift falls on both);
        # every pass compared with the baseline's first, probes beside the first passes only
        passes = [(path, target, rep) for rep in range(cfg.serve.repeats) for path, target in (
            ("baseline", "baseline"), *([("baseline_repeat", "baseline")] if cfg.serve.baseline_repeat and not rep
                                        else []), ("disagg", "disagg"))]
        base: dict[int, ClientResult] = {}
        base_probes: dict[int, ClientResult] = {}
        for path, target, rep in passes:
            p_stats = stats if path == "disagg" else None
            writer = RowWriter(req_out if path == "disagg" else base_out,
                               lambda r, path=path, p_stats=p_stats, base=base, rep=rep: row(
                                   cfg, run_id, device, path, r, workload.prompts[r.prompt_idx],
                                   None if path == "baseline" and not rep else base.get(r.index), p_stats,
                                   spec.rate_at(r.index), rep), p_stats)

            def on_result(r: ClientResult, path=path, put=writer.put, rep=rep) -> None:
                if path == "baseline" and not rep and r.status == "ok":  # a conversation's next turn continues it
                    workload.answered(workload.prompts[r.prompt_idx], r.token_ids)
                put(r)
            probe_writer = on_probe = None
            if probe_out is not None and path != "baseline_repeat" and not rep:  # disagg probes against the baseline's
                probe_writer = RowWriter(probe_out, lambda r, path=path, p_stats=p_stats: row(
                    cfg, run_id, device, f"{path}_probe", r, probe_prompts[r.prompt_idx],
                    base_probes.get(r.index) if path == "disagg" else None, p_stats,
                    1 / cfg.serve.probes.interval_s), p_stats)

                def on_probe(r: ClientResult, path=path, put=probe_writer.put) -> None:
                    if path == "baseline":
                        base_probes[r.index] = r
                    put(r)
            t0 = time.monotonic()
            try:
                results = load(path if not rep else f"{path}-r{rep}", deployment.urls[target],
                               schedule if path != "disagg" else scenario_schedule(cfg, schedule, workload),
                               on_result=on_result, on_probe=on_probe)
            finally:
                writer.close(abandon=sys.exc_info()[0] is not None)
                if probe_writer is not None:
                    probe_writer.close(abandon=sys.exc_info()[0] is not None)
            timings[f"{path}_s"] = timings.get(f"{path}_s", 0.0) + time.monotonic() - t0
            if path == "baseline" and not rep:
                base = {r.index: r for r in results}
        if not deployment.external:
            kv_usage = deployment.kv_usage()
    except (InstanceDied, KeyboardInterrupt) as e:
        status, code, error = ended_early(e, run_dir)
    finally:
        t0 = time.monotonic()
        deployment.stop(grace_s=10 if status == "ok" else 1)
        timings["shutdown_s"] = time.monotonic() - t0
        base_out.close()
        req_out.close()
        if probe_out is not None:
            probe_out.close()

    timings["total_s"] = time.monotonic() - t_run
    summary = serve_summary(run_dir, run_facts(cfg, run_id, device, deployment.external), status=status, error=error,
                            timings=timings, kv_usage=kv_usage, repeats=cfg.serve.repeats,
                            probe_interval_s=cfg.serve.probes.interval_s,
                            expect_recompute=bool(cfg.scenario.get("expect_recompute")),
                            max_accuracy_drop=cfg.check.get("max_accuracy_drop"))
    if status == "ok":
        status, code, error = summary["status"], summary["exit_code"], summary["error"]
        if error:
            print(f"error: {error}", file=sys.stderr)
    write_json(run_dir / "summary.json", summary)
    print(format_serve_summary(summary))
    rows = read_jsonl(run_dir / "requests.jsonl") + read_jsonl(run_dir / "baseline.jsonl")
    track(cfg, run_dir, run_id, summary, rows, failed=code != 0)
    print(f"[harness] {status}: wall {timings['total_s']:.1f} s (start-up "
          f"{timings.get('startup_s', math.nan):.1f} s); results in {run_dir}", flush=True)
    return code
