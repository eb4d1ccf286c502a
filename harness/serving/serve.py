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

import math
import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from harness import scenario
from harness.checks import ConfigError, checked_inputs
from harness.records.files import JsonlWriter, read_jsonl, write_json
from harness.records.meta import versions
from harness.records.serve_summary import serve_summary
from harness.records.tables import format_serve_summary
from harness.records.transfer_records import TransferStats
from harness.records.verdict import ended_early
from harness.serving.checks import check_endpoints, check_serve_inputs, check_serve_workload
from harness.serving.deployment import ServingDeployment
from harness.serving.instances import InstanceDied
from harness.serving.load import LoadError
from harness.serving.passes import Client, ServePasses
from harness.serving.schedule import load_spec, probe_schedule, request_schedule
from harness.settings import Settings, instance_counts, writes_records
from harness.tracking import track
from harness.workload import WorkloadError


def run(cfg: DictConfig, run_dir: Path) -> int:
    """One run as a short sequence (check, start, warm up, the passes, summarize, record); the
    deployment is stopped in `finally`, whatever happened."""
    run_dir.mkdir(parents=True, exist_ok=True)
    run_id = run_dir.name
    t_run = time.monotonic()
    try:
        check_serve_inputs(cfg)
        settings, workload = checked_inputs(cfg)
        check_serve_workload(cfg, load_spec(cfg), workload)
        check_endpoints(cfg)
    except (ConfigError, WorkloadError, LoadError) as e:
        print(f"error: {e}", file=sys.stderr)
        write_json(run_dir / "summary.json", {"status": "bad_input", "error": str(e), "run_id": run_id})
        return 2

    spec = load_spec(cfg)
    schedule = request_schedule(spec, workload)
    probes, probe_prompts = probe_schedule(cfg, schedule)
    write_json(run_dir / "meta.json", {
        "run_id": run_id, "runner": "serve", "versions": versions(settings.device), "strategy": cfg.strategy.name,
        "decode_submit": settings.decode_submit, "model": cfg.model.name, "workload": cfg.workload.name,
        "num_prompts": len(workload.prompts), "num_requests": len(schedule),
        "kv_geometry": settings.kv_geometry and settings.kv_geometry.as_record(),
        "config": OmegaConf.to_container(cfg, resolve=True)})
    deployment = ServingDeployment(settings, run_dir)
    status, code, error = "ok", 0, None
    timings: dict = {}
    kv_usage = {}
    outs = {"baseline": JsonlWriter(run_dir / "baseline.jsonl"), "disagg": JsonlWriter(run_dir / "requests.jsonl"),
            **({"probes": JsonlWriter(run_dir / "probes.jsonl")} if probes else {}),
            **({"control": JsonlWriter(run_dir / "control.jsonl")} if cfg.run.get("no_transfer_control") else {})}
    # each engine's workers write a record file each
    stats = None if deployment.external else TransferStats(*deployment.stats_paths, tp=settings.tp,
                                                           prefill_engines=len(deployment.prefill_names),
                                                           expected=writes_records(cfg))
    passes = ServePasses(settings, Client(cfg, spec, deployment, workload, probes), run_id, stats, outs,
                         probe_prompts, timings)
    try:
        print(f"[harness] {run_id}: serving {len(schedule)} requests at {rate(cfg, spec, workload)} "
              f"({cfg.arrivals.name}), strategy={cfg.strategy.name}, model={cfg.model.name}, device={settings.device}; "
              f"logs in {run_dir}", flush=True)
        t0 = time.monotonic()
        deployment.start(cfg.run.startup_timeout_s)
        timings["startup_s"] = time.monotonic() - t0
        passes.warm_up()
        passes.all(schedule)
        if not deployment.external:
            kv_usage = deployment.kv_usage()
    except (InstanceDied, KeyboardInterrupt) as e:
        status, code, error = ended_early(e, run_dir)
    finally:
        t0 = time.monotonic()
        deployment.stop(grace_s=10 if status == "ok" else 1)
        timings["shutdown_s"] = time.monotonic() - t0
        for out in outs.values():
            out.close()
    timings["total_s"] = time.monotonic() - t_run
    return record(cfg, run_dir, run_facts(settings, run_id, deployment.external), status, code, error, timings,
                  kv_usage, passes.token_sources)


def rate(cfg: DictConfig, spec, workload) -> str:
    """The load as the run's first line states it."""
    if workload.prompts[0].arrival_s is not None:
        return f"the trace's times ({cfg.workload.path}, time scale {cfg.workload.time_scale})"
    if spec.ramp_up is None:
        return f"{spec.request_rate} req/s"
    return f"{spec.ramp_up_start_rps} to {spec.ramp_up_end_rps} req/s ({spec.ramp_up} ramp-up)"


def record(cfg: DictConfig, run_dir: Path, facts: dict, status: str, code: int, error: str | None, timings: dict,
           kv_usage: dict, token_sources: dict | None = None) -> int:
    """summary.json from the rows written (its verdict where the passes all ended), the printed
    summary and the tracker's copy; returns the exit code."""
    summary = serve_summary(run_dir, facts, status=status, error=error, timings=timings, kv_usage=kv_usage,
                            repeats=cfg.serve.repeats, probe_interval_s=cfg.serve.probes.interval_s,
                            expect_recompute=bool(cfg.scenario.get("expect_recompute")),
                            max_accuracy_drop=cfg.check.get("max_accuracy_drop"), expect=scenario.expected(cfg),
                            records_expected=writes_records(cfg) and not facts["external_endpoints"],
                            vllm_token_sources=token_sources)
    if status == "ok":
        status, code, error = summary["status"], summary["exit_code"], summary["error"]
        if error:
            print(f"error: {error}", file=sys.stderr)
    write_json(run_dir / "summary.json", summary)
    print(format_serve_summary(summary))
    rows = read_jsonl(run_dir / "requests.jsonl") + read_jsonl(run_dir / "baseline.jsonl")
    track(cfg, run_dir, facts["run_id"], summary, rows, failed=code != 0)
    print(f"[harness] {status}: wall {timings['total_s']:.1f} s (start-up "
          f"{timings.get('startup_s', math.nan):.1f} s); results in {run_dir}", flush=True)
    return code


def run_facts(settings: Settings, run_id: str, external: bool) -> dict:
    """What the run was, as summary.json states it (harness/records/serve_summary.py)."""
    cfg, device = settings.cfg, settings.device
    trace = cfg.workload.get("_target_") == "harness.workload.trace"
    return {"run_id": run_id, "strategy": cfg.strategy.name, "model": cfg.model.name, "workload": cfg.workload.name,
            "device": device, "external_endpoints": external, "request_rate": float(cfg.serve.request_rate),
            "arrivals": cfg.arrivals.name,
            "trace": {"path": cfg.workload.path, "time_scale": cfg.workload.time_scale} if trace else None,
            "ramp_up": None if cfg.serve.ramp_up is None else {
                "strategy": cfg.serve.ramp_up, "start_rps": cfg.serve.ramp_up_start_rps,
                "end_rps": cfg.serve.ramp_up_end_rps},
            "max_concurrency": cfg.serve.max_concurrency, "instances": None if external else instance_counts(cfg),
            "slo": {"ttft_ms": cfg.slo.ttft_ms, "tpot_ms": cfg.slo.tpot_ms}, "kv_cache_dtype": settings.kv_cache_dtype,
            "kv_geometry": settings.kv_geometry and settings.kv_geometry.describe(),
            "coalesced_gap_ms": cfg.serve.coalesced_gap_ms}
