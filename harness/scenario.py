"""Scenarios (conf/scenario/<name>.yaml): a failure class provoked on purpose. This module is
what the harness knows of them, for both runners; a scenario that provokes something new is its
YAML and a change here.

    check(cfg)                 its values, before any engine starts (exit 2 and one line)
    expected(cfg)              what the run must show (`expect`: summary.json key -> condition), which
                               the verdict judges (records/verdict.py unmet: status scenario_unmet)
    fault_for(cfg, p)          which prompts' transfers carry a transport fault (scenario.fault)
    abort_plan(workload, cfg)  offline: which prompts' requests the harness aborts, when, on which engines
    client_aborts(cfg, n)      runner=serve: which of n requests the client abandons, and when

How a run took them, from its rows, is the records' (harness/records/provoked.py).

A fault travels in the prefill request's kv_transfer_params (offline: from the harness;
runner=serve: the client's X-KV-Fault header, which the router passes on), so one engine pair
serves faulted and clean requests alike; what each fault kind does to the messages is the
connector's (transfer_strategies/faults.py; the kinds: kv_transfer_params.FAULT_KINDS). What a
scenario's YAML sets beside `scenario` (a small KV pool, a short transfer timeout, vLLM's load
failure policy) is ordinary configuration.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from harness.records.verdict import condition
from harness.workload import Prompt, Workload
from transfer_strategies.kv_transfer_params import FAULT_KINDS

ABORT_SIDES = {"prefill": ("prefill",), "decode": ("decode",), "both": ("prefill", "decode")}


class ScenarioError(ValueError):
    pass


def expected(cfg: DictConfig) -> dict:
    """scenario.expect: what the run's summary must show, {summary.json key: condition}."""
    expect = cfg.scenario.get("expect")
    return OmegaConf.to_container(expect, resolve=True) if expect else {}


def check(cfg: DictConfig) -> None:
    for key, text in expected(cfg).items():
        try:
            condition(text)
        except ValueError as e:
            raise ScenarioError(f"scenario.expect.{key}: {e}") from None
    aborts = cfg.scenario.get("aborts")
    if aborts:
        if not (0 < aborts.get("fraction", 0) <= 1 and aborts.get("max_delay_ms", 0) > 0):
            raise ScenarioError(f"scenario.aborts needs a fraction in (0, 1] and a max_delay_ms > 0, got "
                                f"fraction={aborts.get('fraction')!r} max_delay_ms={aborts.get('max_delay_ms')!r}")
        sides = list(aborts.get("sides") or ABORT_SIDES)
        if not sides or any(s not in ABORT_SIDES for s in sides):
            raise ScenarioError(f"scenario.aborts.sides must name some of {', '.join(ABORT_SIDES)}, "
                                f"got {aborts.get('sides')!r}")
    fault = cfg.scenario.get("fault")
    if fault:
        if fault.get("kind") not in FAULT_KINDS:
            raise ScenarioError(f"scenario.fault.kind must be one of {', '.join(FAULT_KINDS)}, "
                                f"got {fault.get('kind')!r}")
        every = fault.get("every", 2)
        if not isinstance(every, int) or every < 1:
            raise ScenarioError(f"scenario.fault.every must be an integer >= 1 (every n-th prompt's transfer), "
                                f"got {every!r}")
        if not cfg.strategy.module:
            raise ScenarioError(f"scenario.fault is injected by this project's connectors; strategy "
                                f"{cfg.strategy.name!r} is vLLM's own {cfg.strategy.connector}")
    if (fault or aborts) and cfg.runner.name == "serve" and cfg.serve.endpoints.disagg is not None:
        raise ScenarioError(f"scenario={cfg.scenario.name}: a fault or abort scenario is judged from the transfer "
                            f"records of instances the harness starts; serve.endpoints has none")


# ---------------------------------------------------------------------- what it provokes
def fault_for(cfg: DictConfig, p: Prompt) -> dict | None:
    """The transport fault of a scenario (scenario.fault) that prompt p's transfer carries: every
    `every`-th prompt of the measured pass (indices every-1, 2*every-1, ...; the warm-up's none),
    so the same prompts are faulted however the requests interleave."""
    fault = cfg.scenario.get("fault")
    if not fault or p.index < 0 or (p.index + 1) % fault.get("every", 2):
        return None
    return {"kind": fault.kind, "delay_s": float(fault.get("delay_s") or cfg.run.transfer_timeout_s + 2)}


@dataclass
class Abort:
    after_s: float  # after its request on each of those engines was submitted
    engines: tuple[str, ...]  # whose requests: ("prefill",), ("decode",) or both


def abort_plan(workload: Workload, cfg: DictConfig) -> dict[int, Abort]:
    """scenario.aborts ({fraction, max_delay_ms, sides}) as prompt index -> Abort: that share of
    the prompts, each at a random point in the first max_delay_ms of its request on that side
    (during its prefill, its transfer or its decode, depending on the prompt; a decode request
    sent only once the prefill answered is abandoned while it loads or decodes), on one of the
    sides (the prefill engine, the decode engine or both; default: any), seeded by engine.seed."""
    spec = cfg.scenario.get("aborts")
    if not spec:
        return {}
    rng = random.Random(cfg.engine.seed)
    sides = [ABORT_SIDES[s] for s in (spec.get("sides") or ABORT_SIDES)]
    chosen = rng.sample(list(workload.prompts), round(spec.fraction * len(workload.prompts)))
    return {p.index: Abort(rng.uniform(0, spec.max_delay_ms / 1e3), rng.choice(sides)) for p in chosen}


def client_aborts(cfg: DictConfig, n: int) -> list[float | None]:
    """runner=serve: for each of n scheduled requests, how long after sending it the client
    abandons it (scenario.aborts' share of them, each at a random time in its first max_delay_ms,
    seeded by serve.seed; closing the connection makes the router abort both upstream requests),
    or None."""
    spec = cfg.scenario.get("aborts")
    rng = random.Random(cfg.serve.seed)
    chosen = set(rng.sample(range(n), round(spec.fraction * n))) if spec else set()
    return [rng.uniform(0, spec.max_delay_ms / 1e3) if i in chosen else None for i in range(n)]
