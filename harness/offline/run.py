"""One harness run: baseline engine, prefill + decode engines, comparison, records.

Everything that can be wrong with the config is checked before any engine starts
(harness/checks.py). Engines are stopped in `finally`, whatever happened.
"""

from __future__ import annotations

import random
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from harness.ceiling import copy_ceiling_gbps
from harness.checks import ConfigError, checked_inputs, decode_submit
from harness.compare import compare_outputs
from harness.engine_config import (
    channel_files,
    engine_args,
    engine_env,
    free_port,
    link_ceiling,
    pulls,
    tp_degrees,
    transfer_config,
)
from harness.engine_process import EngineDied, EngineProcess, next_events, wait_ready
from harness.records import (
    JsonlWriter,
    ended_early,
    format_table,
    run_summary,
    summarize,
    versions,
    write_json,
)
from harness.schema import BaselineRow, RequestRow
from harness.tracking import make_tracker
from harness.transfers import TransferStats, compute_fields, timeline, ttft_overhead_parts
from harness.verdict import judge
from harness.workload import Prompt, Workload, WorkloadError, warmup_workload
from transfer_strategies.kv_transfer_params import push_params
from transfer_strategies.transport import remove_leftovers


# ---------------------------------------------------------------------- driving requests
@dataclass
class _InFlight:
    """One prompt on its way through the stages: its results in request order, with when each
    request was submitted."""

    prompt: Prompt
    t0: float
    results: list
    stage: int = 0
    pending: int = 0  # requests of the current stage not finished yet


def pipeline(stages: list[list[tuple[EngineProcess, Callable[[Prompt, list[dict]], dict]]]], workload: Workload,
             timeout_s: float, on_finish: Callable[[Prompt, float, list[dict]], None], phase: str = "",
             aborts: dict[int, Abort] | None = None) -> None:
    """Run every prompt through the stages in order, with up to `workload.concurrency` prompts in
    flight. A stage is one or more (engine, sampling) requests submitted together; the next stage
    starts when all of them have finished, and its sampling parameters may use the earlier
    results. on_finish gets the results in the order of the requests (each with `submitted_t`;
    an aborted one's finish_reason is "abort"). aborts: prompt index -> when (after the prompt's
    first submission) to abort its requests on which engines, if they are still running then.
    A prompt that follows another (a conversation's next turn) waits until that one has finished
    in this pass, on_finish included (which may build its token ids: Workload.answered)."""
    waiting = list(workload.prompts)
    finished: set[int] = set()
    flights: list[_InFlight] = []
    active: dict[str, tuple[_InFlight, int, float]] = {}  # request id -> its prompt, result index, submitted at
    engines = list({id(e): e for stage in stages for e, _ in stage}.values())
    first_slot = [sum(len(s) for s in stages[:i]) for i in range(len(stages))]

    def submit(f: _InFlight) -> None:
        f.pending = len(stages[f.stage])
        for j, (engine, sampling) in enumerate(stages[f.stage]):
            rid = f"{engine.name}-{f.prompt.index}"
            active[rid] = (f, first_slot[f.stage] + j, time.monotonic())
            engine.submit(rid, f.prompt.token_ids, sampling(f.prompt, f.results))

    due: list[tuple[float, _InFlight, Abort]] = []  # aborts not yet sent

    def send_aborts() -> None:
        now = time.monotonic()
        for item in [d for d in due if d[0] <= now]:
            due.remove(item)
            _, f, abort = item
            for rid, (g, _, _) in list(active.items()):
                engine = next(e for e in engines if rid.startswith(f"{e.name}-"))
                if g is f and engine.name in abort.engines:
                    engine.abort(rid)

    # live on one line in a terminal; in logs and CI a line every 10 s
    progress = tqdm(total=len(workload.prompts), desc=phase or "+".join(e.name for e in engines), unit="req",
                    file=sys.stdout, mininterval=0.5 if sys.stdout.isatty() else 10, dynamic_ncols=True)
    last_progress = time.monotonic()
    with progress:
        while waiting or active:
            while len(flights) < workload.concurrency:
                ready = next((p for p in waiting if p.follows is None or p.follows in finished), None)
                if ready is None:
                    break
                waiting.remove(ready)
                flights.append(_InFlight(ready, time.monotonic(), [None] * sum(map(len, stages))))
                submit(flights[-1])
                abort = (aborts or {}).get(flights[-1].prompt.index)
                if abort is not None:
                    due.append((flights[-1].t0 + abort.after_s, flights[-1], abort))
            wait_s = min([1.0] + [max(d[0] - time.monotonic(), 0.0) for d in due])
            events = next_events(engines, wait_s)
            send_aborts()
            if not events and time.monotonic() - last_progress > timeout_s:
                raise EngineDied(f"no request finished for {timeout_s:.0f} s (run.request_timeout_s); "
                                 f"in flight: {sorted(active)}")
            for _, kind, info in events:
                if kind != "done":
                    continue
                last_progress = time.monotonic()
                f, slot, submitted_t = active.pop(info["req_id"])
                f.results[slot] = dict(info, submitted_t=submitted_t)
                f.pending -= 1
                if f.pending:
                    continue
                f.stage += 1
                if f.stage < len(stages):
                    submit(f)
                else:
                    flights.remove(f)
                    on_finish(f.prompt, f.t0, f.results)
                    finished.add(f.prompt.index)
                    progress.update()


@dataclass
class Abort:
    after_s: float  # after the prompt's first request was submitted
    engines: tuple[str, ...]  # whose requests: ("prefill",), ("decode",) or both


def abort_plan(workload: Workload, spec, seed: int) -> dict[int, Abort]:
    """scenario.aborts ({fraction, max_delay_ms}) as prompt index -> Abort: that share of the
    prompts, each at a random point in its first max_delay_ms (during its prefill, its transfer
    or its decode, depending on the prompt), on the prefill engine, the decode engine or both."""
    if not spec:
        return {}
    rng = random.Random(seed)
    sides = [("prefill",), ("decode",), ("prefill", "decode")]
    chosen = rng.sample(list(workload.prompts), round(spec.fraction * len(workload.prompts)))
    return {p.index: Abort(rng.uniform(0, spec.max_delay_ms / 1e3), rng.choice(sides)) for p in chosen}


def settled_usage(engines: list[EngineProcess], settle_s: float = 15.0) -> tuple[dict, dict]:
    """Once every request has ended: each engine's KV blocks in use and what its connector
    worker still holds ({name: ...}), asked again for up to settle_s while anything is held (a
    request's late KV, cancelled or timed out, is dropped when it comes; vLLM's pull connector
    frees the prefill's blocks on a later step)."""
    deadline = time.monotonic() + settle_s
    while True:
        usage = {e.name: e.usage() for e in engines}
        blocks = {n: u["kv_blocks_in_use"] for n, u in usage.items()}
        held = {n: u.get("transfer_held") for n, u in usage.items()}
        if not (any(blocks.values()) or any(h and any(h.values()) for h in held.values())) \
                or time.monotonic() > deadline:
            return blocks, held
        time.sleep(0.5)


def sampling_params(cfg: DictConfig, max_tokens: int, kv_transfer_params: dict | None = None) -> dict:
    sp = {"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True, "logprobs": cfg.sampling.logprobs,
          "detokenize": False}
    if kv_transfer_params is not None:
        sp["extra_args"] = {"kv_transfer_params": kv_transfer_params}
    return sp


def handoff_params(strategy: DictConfig, stage: str, transfer_id: str, prefill_result: dict | None,
                   early: bool = False) -> dict:
    """kv_transfer_params of a request to the prefill or decode engine.
    push (this project's strategies): both requests carry one transfer id; the prefill worker
      sends, the decode worker takes the message with that id. A decode request submitted early
      (with the prefill request) asks to be parked until its KV is in ("load": "async").
    pull (vLLM's NixlConnector): the prefill request asks the engine to keep the KV for a remote
      decode; the engine answers where it is, and the decode request carries that answer."""
    if not pulls(strategy):
        return push_params(transfer_id, early=stage == "decode" and early)
    if stage == "prefill":
        return {"do_remote_decode": True}
    params = (prefill_result or {}).get("kv_transfer_params")
    if not params:
        raise EngineDied(f"the prefill engine returned no kv_transfer_params for {transfer_id}: "
                         f"strategy {strategy.name!r} cannot hand the request to the decode engine")
    return params


def disagg_row(cfg, run_id: str, device: str, p: Prompt, t0: float, results: list[dict], base: dict,
               stats: TransferStats, transfer_id: str) -> dict:
    """requests.jsonl's row for one prompt: the two engines' results, the baseline's row, both
    sides' transfer records and the request's timeline."""
    pre, dec = results
    send, recv, digest_match = stats.take_transfer(transfer_id)
    computed = compute_fields(stats.take(transfer_id, "prefill"), stats.take(transfer_id, "decode"))

    def sent(name):
        return getattr(send, name) if send else None

    def received(name):
        return getattr(recv, name) if recv else None

    cmp = compare_outputs(base["token_ids"], dec["token_ids"], base["logprobs"], dec["logprobs"],
                          base.get("top_ids"), dec.get("top_ids"))
    ttft = (dec["first_token_t"] - t0) * 1e3
    prefill_ttft = (pre["first_token_t"] - t0) * 1e3
    # On a GPU the transfer is timed on the GPU's clock (CUDA events from the forward pass done
    # to the last payload written); the host's clock adds the wake-up latency of waiting for the
    # GPU at either end (host minus GPU clock was -0.10 to -0.02 ms on an H200).
    transfer_ms = sent("gpu_ms") if sent("gpu_ms") is not None else received("transfer_ms")
    n_bytes = sent("bytes")
    t = timeline(t0, pre, dec, send, recv)
    kv_ms = after_forward_ms = None
    if t["t_forward_done_ms"] is not None:
        if t["t_kv_ready_ms"] is not None:
            kv_ms = t["t_kv_ready_ms"] - t["t_forward_done_ms"]
        after_forward_ms = t["t_first_token_ms"] - t["t_forward_done_ms"]
    # submitted early with nothing to load (all in the decode engine's prefix cache): not parked
    gated = not (decode_submit(cfg) == "early" and recv is not None and recv.blocks == recv.skip_blocks)
    error = received("error")
    if dec.get("finish_reason") == "error":
        error = error or "the decode engine failed the request"
    return RequestRow(
        run_id=run_id, strategy=cfg.strategy.name, model=cfg.model.name, workload=cfg.workload.name, device=device,
        prompt_idx=p.index, prompt_len=len(p.token_ids), output_len=len(dec["token_ids"]),
        conversation=p.conversation, turn=p.turn,
        match=cmp.match, first_divergence=cmp.first_divergence, max_logprob_diff=cmp.max_logprob_diff,
        near_tie=cmp.near_tie, prefill_token_match=pre["token_ids"][:1] == base["token_ids"][:1],
        digest_match=digest_match,
        error=error, base_ttft_ms=base["ttft_ms"], base_e2e_ms=base["e2e_ms"],
        prefill_ms=(pre["finished_t"] - t0) * 1e3, prefill_ttft_ms=prefill_ttft,
        prefill_ttft_overhead_ms=prefill_ttft - base["ttft_ms"], ttft_ms=ttft, e2e_ms=(dec["finished_t"] - t0) * 1e3,
        ttft_overhead_ms=ttft - base["ttft_ms"],
        bytes=n_bytes, messages=sent("messages"), blocks=sent("blocks"), kv_cache_bytes=sent("kv_cache_bytes"),
        skip_blocks=received("skip_blocks"), send_ms=sent("send_ms"), gpu_ms=sent("gpu_ms"),
        transfer_ms=transfer_ms, transfer_host_ms=received("transfer_ms"), kv_ms=kv_ms,
        after_forward_ms=after_forward_ms,
        load_ms=received("load_ms"), ready_ms=received("ready_ms"), notify_ms=received("notify_ms"),
        gbps=n_bytes / transfer_ms / 1e6 if n_bytes and transfer_ms else None,
        **t, **ttft_overhead_parts(t, base["ttft_ms"], kv_gates_first_token=gated), **computed, fault=sent("fault"),
        aborted="+".join(n for n, r in zip(("prefill", "decode"), results) if r.get("finish_reason") == "abort")
        or None,
        token_ids=dec["token_ids"], base_token_ids=base["token_ids"],
    ).to_dict()


# ---------------------------------------------------------------------- the run
def run(cfg: DictConfig, run_dir: Path) -> int:
    """Returns the exit code: 0 all outputs match, 1 a mismatch or digest failure, 2 bad input,
    3 an engine died or stalled, 130 interrupted."""
    run_dir.mkdir(parents=True, exist_ok=True)
    run_id = run_dir.name
    t_run = time.monotonic()
    try:
        device, workload = checked_inputs(cfg)
    except (ConfigError, WorkloadError) as e:
        print(f"error: {e}", file=sys.stderr)
        write_json(run_dir / "summary.json", {"status": "bad_input", "error": str(e), "run_id": run_id})
        return 2

    submit_mode = decode_submit(cfg)
    meta = {"run_id": run_id, "versions": versions(device), "strategy": cfg.strategy.name, "decode_submit": submit_mode,
            "model": cfg.model.name, "workload": cfg.workload.name, "num_prompts": len(workload.prompts),
            "config": OmegaConf.to_container(cfg, resolve=True)}
    write_json(run_dir / "meta.json", meta)
    ceiling = copy_ceiling_gbps(device)  # before the engines start: the machine is quiet
    link = link_ceiling(cfg)
    rendezvous = run_dir / "kv-channel.port"  # the prefill worker writes the port it bound
    for path in channel_files(rendezvous, *tp_degrees(cfg)):
        path.unlink(missing_ok=True)
    stats_paths = (run_dir / "prefill-transfers.jsonl", run_dir / "decode-transfers.jsonl")
    tag = uuid.uuid4().hex[:6]
    specs = {
        "baseline": (engine_args(cfg, device, "baseline"), cfg.device.baseline_gpu),
        "prefill": (dict(engine_args(cfg, device, "prefill"),
                         kv_transfer_config=transfer_config(cfg, "prefill", rendezvous, stats_paths[0])),
                    cfg.device.prefill_gpu),
        "decode": (dict(engine_args(cfg, device, "decode"),
                        kv_transfer_config=transfer_config(cfg, "decode", rendezvous, stats_paths[1])),
                   cfg.device.decode_gpu),
    }
    engines: dict[str, EngineProcess] = {}
    kv_in_use: dict[str, int | None] = {}
    transfer_held: dict[str, dict | None] = {}
    base_rows: dict[int, dict] = {}
    self_match: list[bool] = []  # the baseline's second pass against its first, per prompt (run.baseline_repeat)
    rows: list[dict] = []
    status, code, error = "ok", 0, None
    timings = {}

    def start(name: str) -> EngineProcess:
        a, gpu = specs[name]
        env = engine_env(cfg, device, gpu, name)
        if name != "baseline" and pulls(cfg.strategy):
            # vLLM's NIXL connector listens on a side channel per engine for the handshake
            env.update(VLLM_NIXL_SIDE_CHANNEL_HOST="127.0.0.1", VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_port()))
        engines[name] = EngineProcess(name, a, env, run_dir / f"{name}.log")
        # who is who while the run goes on (a monitor samples their memory: scripts/bench_soak.py)
        write_json(run_dir / "engines.json", {n: e.proc.pid for n, e in engines.items()})
        return engines[name]

    base_out = JsonlWriter(run_dir / "baseline.jsonl")
    req_out = JsonlWriter(run_dir / "requests.jsonl")
    try:
        print(f"[harness] {run_id}: {len(workload.prompts)} prompts, strategy={cfg.strategy.name}, "
              f"model={cfg.model.name}, device={device}; engine logs in {run_dir}", flush=True)
        t0 = time.monotonic()
        first = [start("baseline")] + ([start("prefill"), start("decode")] if cfg.run.overlap_startup else [])
        wait_ready(first, cfg.run.startup_timeout_s)
        timings["startup_s"] = time.monotonic() - t0

        def baseline_row(p: Prompt, t0: float, results: list[dict]) -> dict:
            (r,) = results
            return BaselineRow(run_id=run_id, prompt_idx=p.index, prompt_len=len(p.token_ids),
                               ttft_ms=(r["first_token_t"] - t0) * 1e3, e2e_ms=(r["finished_t"] - t0) * 1e3,
                               token_ids=r["token_ids"], logprobs=r["logprobs"], top_ids=r.get("top_ids")).to_dict()

        def on_base(p: Prompt, t0: float, results: list[dict]) -> None:
            base_rows[p.index] = baseline_row(p, t0, results)
            base_out.write(base_rows[p.index])
            # a conversation's next turn continues the baseline's answer, in every pass after this one too
            workload.answered(p, base_rows[p.index]["token_ids"])

        def repeat_row(p: Prompt, t0: float, results: list[dict], out: JsonlWriter) -> bool:
            row = baseline_row(p, t0, results)
            out.write(row)
            return row["token_ids"] == base_rows[p.index]["token_ids"]

        def warm_up(stages, phase: str, timing: str) -> None:
            """run.warmup_requests unrecorded requests through these stages first."""
            if cfg.run.warmup_requests:
                t0 = time.monotonic()
                pipeline(stages, warmup_workload(workload, cfg.run.warmup_requests), cfg.run.request_timeout_s,
                         lambda p, t0, results: None, phase=phase)
                timings[timing] = time.monotonic() - t0

        colocated = [[(engines["baseline"], lambda p, r: sampling_params(cfg, cfg.sampling.max_tokens))]]
        # warmed up as the P/D path is: a cold engine's first batch (886 and 440 ms TTFT in two runs
        # of the GPU TTFT benchmark) made mean P/D overheads negative
        warm_up(colocated, "baseline warm-up", "baseline_warmup_s")
        t0 = time.monotonic()
        pipeline(colocated, workload, cfg.run.request_timeout_s, on_base)
        timings["baseline_s"] = time.monotonic() - t0
        if cfg.run.baseline_repeat:
            # Greedy outputs can differ with the batch's shape alone: the same prompts at the same
            # concurrency again, computed again (prefix cache emptied), measure that noise
            engines["baseline"].reset_prefix_cache()
            with JsonlWriter(run_dir / "baseline_repeat.jsonl") as repeat_out:
                pipeline(colocated, workload, cfg.run.request_timeout_s,
                         lambda p, t0, results: self_match.append(repeat_row(p, t0, results, repeat_out)),
                         phase="baseline again")
        if not cfg.run.overlap_startup:
            engines["baseline"].stop()
            t0 = time.monotonic()
            wait_ready([start("prefill"), start("decode")], cfg.run.startup_timeout_s)
            timings["startup_s"] += time.monotonic() - t0

        stats = TransferStats(*stats_paths, tp=tp_degrees(cfg), expected=bool(cfg.strategy.module))
        tid = lambda p: f"{tag}-{p.index}"  # noqa: E731

        def on_disagg(p: Prompt, t0: float, results: list[dict]) -> None:
            row = disagg_row(cfg, run_id, device, p, t0, results, base_rows[p.index], stats, tid(p))
            rows.append(row)
            req_out.write(row)

        s, early = cfg.strategy, submit_mode == "early"
        prefill = (engines["prefill"], lambda p, r: sampling_params(cfg, 1, handoff_params(s, "prefill", tid(p), None)))
        decode = (engines["decode"], lambda p, r: sampling_params(
            cfg, cfg.sampling.max_tokens, handoff_params(s, "decode", tid(p), r[0], early)))
        disagg = [[prefill, decode]] if early else [[prefill], [decode]]
        # The engines warmed up on their own, but not through the connector: its first transfers
        # pay one-off costs (first copies, CUDA IPC mapping, digest weights)
        warm_up(disagg, "warm-up", "warmup_s")

        t0 = time.monotonic()
        pipeline(disagg, workload, cfg.run.request_timeout_s, on_disagg,
                 aborts=abort_plan(workload, cfg.scenario.get("aborts"), cfg.engine.seed))
        timings["disagg_s"] = time.monotonic() - t0
        # every request has finished: a block still held is a leak (a parked request never released)
        # vLLM's pull connector frees the prefill's blocks on a later step (not waited for: reported)
        kv_in_use, transfer_held = settled_usage([engines["prefill"], engines["decode"]],
                                                 settle_s=15.0 if cfg.strategy.module else 0.0)
    except (EngineDied, KeyboardInterrupt) as e:
        status, code, error = ended_early(e, run_dir)
    finally:
        t0 = time.monotonic()
        for e in engines.values():
            e.stop(grace_s=10 if status == "ok" else 1)
        timings["shutdown_s"] = time.monotonic() - t0
        # engines killed while opening the KV channel leave its buffer behind
        remove_leftovers(channel_files(rendezvous, *tp_degrees(cfg)))
        base_out.close()
        req_out.close()

    timings["engine_startup_s"] = {n: round(e.startup_s, 2) for n, e in engines.items()}
    timings["total_s"] = time.monotonic() - t_run
    summary = run_summary(rows, status=status, error=error, run_id=run_id, strategy=cfg.strategy.name,
                          model=cfg.model.name, workload=cfg.workload.name, device=device, copy_ceiling_gbps=ceiling,
                          timings=timings, engine_pids={n: e.proc.pid for n, e in engines.items()},
                          cudagraph_modes={n: e.cudagraph_mode for n, e in engines.items()},
                          decode_submit=submit_mode, kv_blocks_in_use=kv_in_use, transfer_held=transfer_held,
                          **({"link_ceiling_gbps": link} if link is not None else {}),
                          baseline_self_mismatches=self_match.count(False) if self_match else None,
                          baseline_self_match_rate=self_match.count(True) / len(self_match) if self_match else None)
    if status == "ok":
        # vLLM's pull connector frees the prefill's blocks when a later engine step hears that the
        # decode engine has read them: an idle engine still holds the last ones
        leaked = {n: k for n, k in kv_in_use.items() if k and cfg.strategy.module}
        leaked.update({n: h for n, h in transfer_held.items() if h and any(h.values())})
        # a scenario's faulted transfers and aborted requests are judged apart (faults: each must
        # have been caught; aborts: nothing they held may stay held, checked below)
        provoked = [r for r in rows if r.get("fault") or r.get("aborted")]
        judged = summarize([r for r in rows if r not in provoked]) if provoked else summary
        first = next((r["error"] for r in rows if r.get("error") and not r.get("fault")), None)
        status, error = judge(judged, noise=summary["baseline_self_mismatches"] or 0,
                              expect_recompute=cfg.scenario.expect_recompute, first_transfer_error=first,
                              faults=(summary.get("faults_missed") or 0, summary.get("faults_injected") or 0),
                              held=leaked)
        code = 0 if status == "ok" else 1
        summary.update(status=status, error=error)
        if error:
            print(f"error: {error}", file=sys.stderr)
    write_json(run_dir / "summary.json", summary)
    if rows:
        print(format_table(rows, summary))
    try:
        tracker = make_tracker(cfg, run_dir, run_id)
        tracker.log_summary(summary)
        tracker.log_requests(rows)
        tracker.finish(failed=code != 0)
    except Exception as e:  # noqa: BLE001 - tracking must never cost the results already on disk
        print(f"warning: tracking failed ({e}); results are in {run_dir}", file=sys.stderr)
    print(f"[harness] {status}: wall {timings['total_s']:.1f} s (engine start-up "
          f"{timings.get('startup_s', float('nan')):.1f} s); results in {run_dir}", flush=True)
    return code
