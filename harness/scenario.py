"""What a scenario (conf/scenario) asks of single requests, for both runners: which prompts'
transfers carry a transport fault. The fault travels in the prefill request's kv_transfer_params
(offline: from the harness; runner=serve: the client's X-KV-Fault header, which the router
passes on), so one engine pair serves faulted and clean requests alike."""

from __future__ import annotations

from omegaconf import DictConfig

from harness.workload import Prompt


def fault_for(cfg: DictConfig, p: Prompt) -> dict | None:
    """The transport fault of a scenario (scenario.fault) that prompt p's transfer carries: every
    `every`-th prompt of the measured pass (indices every-1, 2*every-1, ...; the warm-up's none),
    so the same prompts are faulted however the requests interleave."""
    fault = cfg.scenario.get("fault")
    if not fault or p.index < 0 or (p.index + 1) % fault.get("every", 2):
        return None
    return {"kind": fault.kind, "delay_s": float(fault.get("delay_s") or cfg.run.transfer_timeout_s + 2)}
