"""runner=offline, one harness run: the baseline engine, then the prefill and decode engines
(offline/deployment.py), every prompt through both paths (offline/pipeline.py), each P/D output
compared with the baseline's (offline/rows.py), the whole judged (harness/records/verdict.py) and recorded.

Everything that can be wrong with the config is checked before any engine starts
(harness/checks.py). Engines are stopped in `finally`, whatever happened.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from harness import scenario
from harness.ceiling import copy_ceiling_gbps
from harness.checks import ConfigError, checked_inputs
from harness.engine_config import link_ceiling
from harness.engine_process import EngineDied
from harness.link import LinkError, VethLink, link_for, open_link
from harness.link import apply as apply_link
from harness.offline.deployment import OfflineDeployment
from harness.offline.engine_pool import POOL
from harness.offline.rows import RunRows
from harness.records.files import JsonlWriter, write_json
from harness.records.meta import versions
from harness.records.provoked import provoked
from harness.records.summary import run_summary, summarize
from harness.records.tables import format_run_table
from harness.records.verdict import ended_early, judge, unmet
from harness.tracking import track
from harness.workload import Workload, WorkloadError, warmup_workload


def run(cfg: DictConfig, run_dir: Path) -> int:
    """Returns the exit code: 0 all outputs match, 1 a mismatch or digest failure, 2 bad input,
    3 an engine died or stalled, 130 interrupted. With link=veth the run's engines sit on either
    side of a shaped link, made for it or (run.reuse_engines) the one the engines an earlier run
    kept sit on, reshaped; removed once neither the run nor kept engines hold it (harness/link.py)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        spec = link_for(cfg)
        if spec is None:
            return _run(cfg, run_dir)
        link = open_link(spec, share=cfg.run.reuse_engines)
        try:
            apply_link(cfg, link)
            return _run(cfg, run_dir, link)
        finally:
            link.release()
    except LinkError as e:
        return bad_input(run_dir, e)


def bad_input(run_dir: Path, e: Exception) -> int:
    print(f"error: {e}", file=sys.stderr)
    write_json(run_dir / "summary.json", {"status": "bad_input", "error": str(e), "run_id": run_dir.name})
    return 2


def _run(cfg: DictConfig, run_dir: Path, link: VethLink | None = None) -> int:
    run_id = run_dir.name
    t_run = time.monotonic()
    try:
        settings, workload = checked_inputs(cfg)
    except (ConfigError, WorkloadError) as e:
        return bad_input(run_dir, e)

    device = settings.device
    geometry = settings.kv_geometry
    meta = {"run_id": run_id, "versions": versions(device), "strategy": cfg.strategy.name,
            "decode_submit": settings.decode_submit, "model": cfg.model.name, "workload": cfg.workload.name,
            "num_prompts": len(workload.prompts), "kv_geometry": geometry and geometry.as_record(),
            "config": OmegaConf.to_container(cfg, resolve=True)}
    write_json(run_dir / "meta.json", meta)
    ceiling = copy_ceiling_gbps(device)  # before the engines start: the machine is quiet
    link_gbps = link_ceiling(cfg)
    deployment = OfflineDeployment(settings, run_dir, pool=POOL if cfg.run.reuse_engines else None, link=link)
    rows = RunRows(settings, run_dir, run_id)
    kv_in_use: dict[str, int | None] = {}
    transfer_held: dict[str, dict | None] = {}
    status, code, error = "ok", 0, None
    timings = {}
    # the engines that may serve the next run (run.reuse_engines): the baseline once its passes have
    # ended (idle, whatever happens on the P/D path), the P/D pair once every request has ended with
    # nothing held
    reusable: set[str] = set()
    try:
        print(f"[harness] {run_id}: {len(workload.prompts)} prompts, strategy={cfg.strategy.name}, "
              f"model={cfg.model.name} (KV: {geometry.describe() if geometry else 'geometry unknown'}), "
              f"device={device}; engine logs in {run_dir}", flush=True)
        timings["startup_s"] = deployment.start()
        baseline_passes(cfg, deployment, workload, rows, timings)
        reusable.add("baseline")
        timings["startup_s"] += deployment.start_disagg()
        disagg_passes(cfg, deployment, workload, rows, timings)
        if cfg.run.no_transfer_control:
            with JsonlWriter(run_dir / "control.jsonl") as out:
                deployment.control_pass(workload, lambda p, t0, results: rows.add_control(p, t0, results, out),
                                        phase="no-transfer control")
        # every request has finished: a block still held is a leak (a parked request never released)
        # (vLLM's pull connector frees the prefill's blocks on a later step: the engine steps for it, usage)
        kv_in_use, transfer_held = deployment.usage()
        if all(v == 0 for v in kv_in_use.values()) and not any(h and any(h.values()) for h in transfer_held.values()):
            reusable.add("disagg")
    except (EngineDied, KeyboardInterrupt) as e:
        status, code, error = ended_early(e, run_dir)
    finally:
        timings["shutdown_s"] = deployment.stop(grace_s=10 if status == "ok" else 1, keep=reusable)
        rows.close()

    # what this run paid: nothing for the engines it took from the pool
    timings["engine_startup_s"] = {n: 0.0 if deployment.reused[n] else round(e.startup_s, 2)
                                   for n, e in deployment.engines.items()}
    timings["total_s"] = time.monotonic() - t_run
    self_match, control = rows.self_match, rows.control_match
    summary = run_summary(rows.requests, status=status, error=error, run_id=run_id, strategy=cfg.strategy.name,
                          model=cfg.model.name, workload=cfg.workload.name, device=device, copy_ceiling_gbps=ceiling,
                          timings=timings, engine_pids={n: e.proc.pid for n, e in deployment.engines.items()},
                          cudagraph_modes={n: e.cudagraph_mode for n, e in deployment.engines.items()},
                          decode_submit=settings.decode_submit, kv_blocks_in_use=kv_in_use, transfer_held=transfer_held,
                          engines_reused=dict(deployment.reused), engine_logs=deployment.engine_logs(),
                          kv_cache_dtype=settings.kv_cache_dtype,
                          kv_geometry=settings.kv_geometry and settings.kv_geometry.describe(),
                          **({"link_ceiling_gbps": link_gbps} if link_gbps is not None else {}),
                          **({"link": link.spec.summary()} if link is not None else {}),
                          baseline_self_mismatches=self_match.count(False) if self_match else None,
                          baseline_self_match_rate=self_match.count(True) / len(self_match) if self_match else None,
                          control_mismatches=control.count(False) if control else None,
                          control_match_rate=control.count(True) / len(control) if control else None)
    if status == "ok":
        status, code, error = judged(cfg, summary, rows.requests, kv_in_use, transfer_held)
    record(cfg, run_dir, run_id, summary, rows.requests, code)
    print(f"[harness] {status}: wall {timings['total_s']:.1f} s (engine start-up "
          f"{timings.get('startup_s', float('nan')):.1f} s); results in {run_dir}", flush=True)
    return code


def warm_up(cfg: DictConfig, measure_pass, workload: Workload, phase: str, timing: str, timings: dict) -> None:
    """run.warmup_requests rounds of unrecorded requests through a pass's engines first, each a
    prompt of every length range the workload takes and at least a full batch (warmup_workload)."""
    if cfg.run.warmup_requests:
        t0 = time.monotonic()
        measure_pass(warmup_workload(workload, cfg.run.warmup_requests), lambda p, t0, results: None, phase=phase)
        timings[timing] = time.monotonic() - t0


def baseline_passes(cfg: DictConfig, deployment: OfflineDeployment, workload: Workload, rows: RunRows,
                    timings: dict) -> None:
    """The baseline engine's warm-up, its pass (baseline.jsonl) and with run.baseline_repeat its
    pass again (baseline_repeat.jsonl)."""

    def on_base(p, t0, results) -> None:
        row = rows.add_baseline(p, t0, results)
        # a conversation's next turn continues the baseline's answer, in every pass after this one too
        workload.answered(p, row["token_ids"])

    # warmed up as the P/D path is: a cold engine's first batch (886 and 440 ms TTFT in two runs
    # of the GPU TTFT benchmark) made mean P/D overheads negative
    warm_up(cfg, deployment.baseline_pass, workload, "baseline warm-up", "baseline_warmup_s", timings)
    t0 = time.monotonic()
    deployment.baseline_pass(workload, on_base)
    timings["baseline_s"] = time.monotonic() - t0
    if cfg.run.baseline_repeat:
        # Greedy outputs can differ with the batch's shape alone: the same prompts at the same
        # concurrency again, computed again (prefix cache emptied), measure that noise
        deployment.reset_baseline_prefix_cache()
        with JsonlWriter(deployment.run_dir / "baseline_repeat.jsonl") as repeat_out:
            deployment.baseline_pass(workload, lambda p, t0, results: rows.add_repeat(p, t0, results, repeat_out),
                                     phase="baseline again")


def disagg_passes(cfg: DictConfig, deployment: OfflineDeployment, workload: Workload, rows: RunRows,
                  timings: dict) -> None:
    """The P/D path's warm-up and its pass (requests.jsonl), with the scenario's aborts."""
    stats = deployment.transfer_stats()
    # The engines warmed up on their own, but not through the connector: its first transfers
    # pay one-off costs (first copies, CUDA IPC mapping, digest weights)
    warm_up(cfg, deployment.disagg_pass, workload, "warm-up", "warmup_s", timings)
    t0 = time.monotonic()
    deployment.disagg_pass(
        workload, lambda p, t0, results: rows.add_request(p, t0, results, stats, deployment.transfer_id(p)),
        aborts=scenario.abort_plan(workload, cfg))
    timings["disagg_s"] = time.monotonic() - t0


def judged(cfg: DictConfig, summary: dict, rows: list[dict], kv_in_use: dict, transfer_held: dict
           ) -> tuple[str, int, str | None]:
    """(status, exit code, error) of a run whose passes all ended: its verdict, put in the summary."""
    # vLLM's pull connector frees the prefill's blocks when a later engine step hears that the
    # decode engine has read them: an idle engine still holds the last ones
    leaked = {n: k for n, k in kv_in_use.items() if k and cfg.strategy.module}
    leaked.update({n: h for n, h in transfer_held.items() if h and any(h.values())})
    # a scenario's faulted transfers and aborted requests are judged apart (faults: each must
    # have been caught; aborts: nothing they held may stay held, checked below)
    provoked_rows = [r for r in rows if provoked(r)]
    counted = summarize([r for r in rows if r not in provoked_rows]) if provoked_rows else summary
    first = next((r["error"] for r in rows if r.get("error") and not r.get("fault")), None)
    lossy = bool(summary.get("codec") or summary.get("kv_cache_dtype"))
    if lossy:  # outputs that differ are the compression's, not KV used wrongly
        summary.pop("diagnosis", None)
    status, error = judge(counted, noise=summary["baseline_self_mismatches"] or 0,
                          expect_recompute=cfg.scenario.expect_recompute, first_transfer_error=first,
                          faults=(summary.get("faults_missed") or 0, summary.get("faults_injected") or 0),
                          held=leaked, lossy=lossy, accuracy_drop=summary.get("accuracy_drop"),
                          max_accuracy_drop=cfg.check.get("max_accuracy_drop"),
                          scenario_unmet=unmet(summary, scenario.expected(cfg)))
    summary.update(status=status, error=error)
    if error:
        print(f"error: {error}", file=sys.stderr)
    return status, 0 if status == "ok" else 1, error


def record(cfg: DictConfig, run_dir: Path, run_id: str, summary: dict, rows: list[dict], code: int) -> None:
    """summary.json, the table of the P/D rows, and the tracker's copy of both (cfg.tracking)."""
    write_json(run_dir / "summary.json", summary)
    if rows:
        print(format_run_table(rows, summary))
    track(cfg, run_dir, run_id, summary, rows, failed=code != 0)
