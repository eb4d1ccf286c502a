"""What runner=serve sends and when: the load's arrival schedule (the same on every path, seeded by
serve.seed), the probes beside it, and the P/D path's schedule with a scenario's faults and aborts."""

from __future__ import annotations

import dataclasses
import math
import random

import numpy as np
from omegaconf import DictConfig

from harness import scenario
from harness.serving.arrivals import build as build_arrivals
from harness.serving.load import LoadSpec, ScheduledRequest, arrival_schedule
from harness.workload import ANY_VOCAB, Prompt, Workload


def load_spec(cfg: DictConfig) -> LoadSpec:
    s = cfg.serve
    return LoadSpec(request_rate=float(s.request_rate), arrivals=build_arrivals(cfg.arrivals),
                    num_requests=s.num_requests, duration_s=s.duration_s, max_concurrency=s.max_concurrency,
                    seed=s.seed, cancel_fraction=float(s.cancel_fraction), ramp_up=s.ramp_up,
                    ramp_up_start_rps=s.ramp_up_start_rps, ramp_up_end_rps=s.ramp_up_end_rps)


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


def scenario_schedule(cfg: DictConfig, schedule: list[ScheduledRequest], workload: Workload
                      ) -> list[ScheduledRequest]:
    """The P/D path's schedule with the scenario's faults and aborts: the transfer of every request
    of a faulted prompt (harness/scenario.py fault_for, as offline) carries the fault; a share of the
    requests (scenario.aborts.fraction, seeded by serve.seed) is abandoned by the client at a
    random time in its first max_delay_ms, during its prefill, its transfer or its decode."""
    abandon = scenario.client_aborts(cfg, len(schedule))
    return [dataclasses.replace(r, fault=scenario.fault_for(cfg, workload.prompts[r.prompt_idx]),
                                abort_after_s=abandon[i]) for i, r in enumerate(schedule)]
