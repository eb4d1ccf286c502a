"""runner=serve's own checks, before any instance starts (bad input: exit 2 and one line): the load,
the SLOs, the probes, each side's instances and the routers' policies, the endpoints a user
brings, and what a workload allows (harness/checks.py checks the rest, as for the offline runner)."""

from __future__ import annotations

import urllib.error
import urllib.request

from omegaconf import DictConfig

from harness.serving.load import LoadError, LoadSpec
from harness.serving.pool import POLICIES
from harness.serving.schedule import load_spec
from harness.serving.selective import PD_POLICIES, Selective
from harness.settings import relays
from harness.workload import Workload


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
    if cfg.run.get("no_transfer_control") and ends.baseline is not None:
        raise LoadError("run.no_transfer_control sends requests to the decode instances alone through the project's "
                        "router: not with serve.endpoints (a router of your own)")
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
    check_pd_policy(cfg)
    pairs = cfg.serve.prefill_instances * cfg.serve.decode_instances
    if pairs > 1 and cfg.transport.get("address") and not relays(cfg.strategy):
        raise LoadError(f"transport.address is where one prefill worker listens: with it runner=serve takes one "
                        f"prefill and one decode instance, got {cfg.serve.prefill_instances}P"
                        f"{cfg.serve.decode_instances}D")


def check_pd_policy(cfg: DictConfig) -> None:
    """serve.pd_policy and its thresholds (harness/serving/selective.py)."""
    s = cfg.serve
    if s.pd_policy not in PD_POLICIES:
        raise LoadError(f"serve.pd_policy must be one of {', '.join(PD_POLICIES)}, got {s.pd_policy!r}")
    if s.pd_policy == "always":
        return
    try:
        Selective(s.selective.min_prompt_tokens, s.selective.min_uncached_tokens)
    except ValueError as e:
        raise LoadError(f"serve.selective.{e}") from None
    if s.endpoints.baseline is not None:
        raise LoadError("serve.pd_policy=selective is the project's router's: endpoints a user brings route "
                        "requests themselves")


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


def check_serve_workload(cfg: DictConfig, spec: LoadSpec, workload: Workload) -> None:
    if any(p.follows is not None for p in workload.prompts):
        abandoning = {"serve.cancel_fraction": spec.cancel_fraction, "scenario.aborts": cfg.scenario.get("aborts")}
        for name, on in abandoning.items():
            if on:
                raise LoadError(f"{name} with workload {workload.name!r}: a cancelled turn has no answer for its "
                                f"conversation's next turn to continue")
