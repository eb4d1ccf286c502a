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
    an aborted one's finish_reason is "abort"). aborts: prompt index -> when (after the prompt's
    first submission) to abort its requests on which engines, if they are still running then.
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

    def submit(f: _InFlight) -> None:
        f.pending = len(stages[f.stage])
        for j, (engine, sampling) in enumerate(stages[f.stage]):
            rid = request_id(f.prompt) if request_id else str(f.prompt.index)
            active[engine.name, rid] = (f, first_slot[f.stage] + j, time.monotonic())
            engine.submit(rid, f.prompt.token_ids, sampling(f.prompt, f.results))

    due: list[tuple[float, _InFlight, Abort]] = []  # aborts not yet sent

    def send_aborts() -> None:
        now = time.monotonic()
        for item in [d for d in due if d[0] <= now]:
            due.remove(item)
            _, f, abort = item
            for (name, rid), (g, _, _) in list(active.items()):
                if g is f and name in abort.engines:
                    next(e for e in engines if e.name == name).abort(rid)

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
                if f.stage < len(stages):
                    submit(f)
                else:
                    flights.remove(f)
                    on_finish(f.prompt, f.t0, f.results)
                    finished.add(f.prompt.index)
                    progress.update()


