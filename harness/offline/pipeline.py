"""Driving prompts through the offline runner's engines (pipeline): up to workload.concurrency
prompts in flight, each through stages of requests to EngineProcesses (harness/engine_process.py),
and the aborts a scenario sends while they run (harness/scenario.py abort_plan)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from tqdm import tqdm

from harness.engine_process import EngineDied, EngineProcess, next_events
from harness.scenario import Abort
from harness.workload import Prompt, Workload

# the result of a request not sent because an earlier one of its prompt was aborted (relay: the
# prefill request, whose answer the decode request would have carried)
NOT_SENT = {"token_ids": [], "logprobs": None, "finish_reason": "not_sent", "kv_transfer_params": None}


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
             aborts: dict[int, Abort] | None = None, request_id: Callable[[Prompt], str] | None = None) -> None:
    """Run every prompt through the stages in order, with up to `workload.concurrency` prompts in
    flight. A stage is one or more (engine, sampling) requests submitted together; the next stage
    starts when all of them have finished, and its sampling parameters may use the earlier
    results. on_finish gets the results in the order of the requests (each with `submitted_t`;
    an aborted one's finish_reason is "abort", and a prompt with an aborted request sends none of
    its later stages: their results say "not_sent"). aborts: prompt index -> when (after each
    request's own submission) to abort its requests on which engines, if still running then.
    A prompt that follows another (a conversation's next turn) waits until that one has finished
    in this pass, on_finish included (which may build its token ids: Workload.answered).
    request_id: a prompt's requests' id on every engine (default: its index); vLLM's NIXL push
    connector pairs a prefill request with its decode request by id, as vLLM's proxy sends one."""
    waiting = list(workload.prompts)
    finished: set[int] = set()
    flights: list[_InFlight] = []
    # (engine name, request id) -> its prompt, result index, submitted at
    active: dict[tuple[str, str], tuple[_InFlight, int, float]] = {}
    engines = list({id(e): e for stage in stages for e, _ in stage}.values())
    first_slot = [sum(len(s) for s in stages[:i]) for i in range(len(stages))]

    due: list[tuple[float, _InFlight, str]] = []  # aborts not yet sent: when, whose, on which engine

    def submit(f: _InFlight) -> None:
        f.pending = len(stages[f.stage])
        abort = (aborts or {}).get(f.prompt.index)
        for j, (engine, sampling) in enumerate(stages[f.stage]):
            rid = request_id(f.prompt) if request_id else str(f.prompt.index)
            active[engine.name, rid] = (f, first_slot[f.stage] + j, time.monotonic())
            engine.submit(rid, f.prompt.token_ids, sampling(f.prompt, f.results))
            # timed from this request's own submission: a decode request sent only once the prefill
            # answered (vLLM's connectors) is abandoned while it loads or decodes, as one sent early is
            if abort is not None and engine.name in abort.engines:
                due.append((time.monotonic() + abort.after_s, f, engine.name))

    def send_aborts() -> None:
        now = time.monotonic()
        for item in [d for d in due if d[0] <= now]:
            due.remove(item)
            _, f, name = item
            for (engine, rid), (g, _, _) in list(active.items()):
                if g is f and engine == name:
                    next(e for e in engines if e.name == name).abort(rid)

    def abandoned(f: _InFlight) -> bool:
        return any(r is not None and r.get("finish_reason") == "abort" for r in f.results)

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
            wait_s = min([1.0] + [max(d[0] - time.monotonic(), 0.0) for d in due])
            events = next_events(engines, wait_s)
            send_aborts()
            if not events and time.monotonic() - last_progress > timeout_s:
                raise EngineDied(f"no request finished for {timeout_s:.0f} s (run.request_timeout_s); "
                                 f"in flight: {sorted(f'{name} {rid}' for name, rid in active)}")
            for engine, kind, info in events:
                if kind != "done":
                    continue
                last_progress = time.monotonic()
                f, slot, submitted_t = active.pop((engine.name, info["req_id"]))
                f.results[slot] = dict(info, submitted_t=submitted_t)
                f.pending -= 1
                if f.pending:
                    continue
                f.stage += 1
                if f.stage < len(stages) and not abandoned(f):
                    submit(f)
                else:
                    if f.stage < len(stages):  # a router sends nothing more for a client gone away
                        now = time.monotonic()
                        f.results = [r or dict(NOT_SENT, first_token_t=now, finished_t=now, submitted_t=None)
                                     for r in f.results]
                    flights.remove(f)
                    on_finish(f.prompt, f.t0, f.results)
                    finished.add(f.prompt.index)
                    progress.update()


