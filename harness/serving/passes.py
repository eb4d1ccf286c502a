"""runner=serve's passes, as the offline runner's (offline/run.py): the warm-up of both paths, then
the schedule sent to each path in turn (the baseline, its second pass for its own noise, the P/D
path), serve.repeats times, interleaved so that drift falls on both; the probes beside each path's
first pass; every request's row written as it ends (rows.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time
import uuid

from omegaconf import DictConfig

from harness.records.files import JsonlWriter
from harness.records.schema import DECODE_ONLY
from harness.records.transfer_records import TransferStats
from harness.serving.deployment import ServingDeployment
from harness.serving.instances import InstanceDied
from harness.serving.load import ClientResult, LoadSpec, ScheduledRequest, send_all
from harness.serving.rows import RowWriter, row
from harness.serving.schedule import scenario_schedule
from harness.settings import Settings, instance_counts
from harness.workload import Prompt, Workload, warmup_workload


def served_model(cfg: DictConfig) -> str:
    return cfg.serve.model_name or str(cfg.model.path)


class Client:
    """The load generator as a run uses it: the served model, the run's request ids, its sampling,
    the deployment's watchdog (an instance that dies ends the load), a conversation's turns."""

    def __init__(self, cfg: DictConfig, spec: LoadSpec, deployment: ServingDeployment, workload: Workload,
                 probes: list[ScheduledRequest]):
        self.cfg, self.spec, self.deployment, self.workload, self.probes = cfg, spec, deployment, workload, probes
        self.model, self.tag = served_model(cfg), uuid.uuid4().hex[:6]

    def _sending(self, path: str, url: str, reqs, on_result, timeout_s: float, limit: int | None):
        d, w = self.deployment, self.workload
        return send_all(url, self.model, reqs, max_tokens=self.cfg.sampling.max_tokens, max_concurrency=limit,
                        timeout_s=timeout_s, id_prefix=f"{self.tag}-{path}", logprobs=self.cfg.sampling.logprobs,
                        on_result=on_result, watchdog=None if d.external else d.watchdog,
                        turn_ids=lambda req: w.prompts[req.prompt_idx].token_ids)

    def load(self, path: str, url: str, reqs, on_result=None, timeout_s: float | None = None, on_probe=None):
        """The requests on one path, with the probes beside them where on_probe takes them."""
        timeout_s = timeout_s or self.cfg.run.request_timeout_s
        limit = self.spec.max_concurrency
        if on_probe is None:
            return asyncio.run(self._sending(path, url, reqs, on_result, timeout_s, limit))

        async def beside():
            results, _ = await asyncio.gather(self._sending(path, url, reqs, on_result, timeout_s, limit),
                                              self._sending(f"{path}-probe", url, self.probes, on_probe, timeout_s,
                                                            None))
            return results
        return asyncio.run(beside())


# a request's first use of a connector can fail where later ones do not: vLLM's NIXL handshake waits
# a fixed 5 s for the prefill engine's answer, which a loaded 2-core machine missed once (make test-full)
WARMUP_TRIES = 3


class ServePasses:
    """A run's passes over its deployment, each request's row written as it ends (baseline.jsonl,
    requests.jsonl, probes.jsonl), every pass compared with the baseline's first."""

    def __init__(self, settings: Settings, client: Client, run_id: str, stats: TransferStats | None,
                 outs: dict[str, JsonlWriter], probe_prompts: list[Prompt], timings: dict):
        self.settings, self.cfg, self.client, self.run_id, self.stats = settings, settings.cfg, client, run_id, stats
        self.outs, self.probe_prompts, self.timings = outs, probe_prompts, timings
        self.base: dict[int, ClientResult] = {}  # the baseline's first pass, by request
        self.base_probes: dict[int, ClientResult] = {}
        # vLLM's own count of the decode instances' prompt tokens by source over the P/D passes
        self.token_sources: dict[str, float] = {}

    def warm_up(self) -> None:
        """run.warmup_requests rounds of unmeasured requests through each path first: every
        instance's first use (the connector's included) and every length range of the workload, at
        least as many at once as the largest side has instances (round robin and least outstanding
        both spread requests sent together), with none of the measured prompts' tokens, which a
        prefix cache would keep (warmup_workload). A warm-up request that fails is sent again, up to
        WARMUP_TRIES times in all, each time said on stdout; the measured requests get no second try."""
        cfg, d = self.cfg, self.client.deployment
        if not cfg.run.warmup_requests:
            return
        t0 = time.monotonic()
        sides = tuple(instance_counts(cfg).values())
        warm = [ScheduledRequest(i, p.index, p.token_ids, 0.0) for i, p in enumerate(
            warmup_workload(self.client.workload, cfg.run.warmup_requests, batch=max(sides)).prompts)]
        for path in ("baseline", "disagg"):
            todo = warm
            for attempt in range(WARMUP_TRIES):
                # first use (the connector's buffers, compilation) may take far longer than a request may
                label = f"warmup-{path}" + (f"-again{attempt}" if attempt else "")
                failed = [r for r in self.client.load(label, d.urls[path], todo, timeout_s=cfg.run.startup_timeout_s)
                          if r.status != "ok"]
                if not failed:
                    break
                print(f"[harness] {len(failed)} warm-up request(s) through the {path} path failed, sent again: "
                      f"{failed[0].error}", flush=True)
                todo = [w for w in todo if w.index in {r.index for r in failed}]
            else:
                raise InstanceDied(f"warm-up request through the {path} path failed {WARMUP_TRIES} times: "
                                   f"{failed[0].error}")
        self.timings["warmup_s"] = time.monotonic() - t0

    def all(self, schedule: list[ScheduledRequest]) -> None:
        """serve.repeats passes of the schedule on each path, interleaved; the baseline's second pass
        once; probes beside the first passes only. run.no_transfer_control: after the first P/D
        pass, the same schedule through the P/D router once more, each request asking for its
        decode instance alone, whose prefix cache is emptied first (control.jsonl)."""
        for rep in range(self.cfg.serve.repeats):
            self.one("baseline", "baseline", rep, schedule)
            if self.cfg.serve.baseline_repeat and not rep:
                self.one("baseline_repeat", "baseline", rep, schedule)
            self.one("disagg", "disagg", rep, schedule)
            if self.cfg.run.get("no_transfer_control") and not rep:
                self.client.deployment.reset_decode_caches()
                self.one("control", "disagg", rep, [dataclasses.replace(r, route=DECODE_ONLY) for r in schedule])

    def one(self, path: str, target: str, rep: int, schedule: list[ScheduledRequest]) -> None:
        cfg, workload = self.cfg, self.client.workload
        stats = self.stats if path == "disagg" else None
        first_baseline = path == "baseline" and not rep
        base = self.base  # the baseline's first pass (empty while it runs: what it is compared with is itself)
        writer = RowWriter(self.outs[path if path in ("disagg", "control") else "baseline"], lambda r: row(
            self.settings, self.run_id, path, r, workload.prompts[r.prompt_idx],
            None if first_baseline else base.get(r.index), stats, self.client.spec.rate_at(r.index), rep), stats)

        def on_result(r: ClientResult) -> None:
            if first_baseline and r.status == "ok":  # a conversation's next turn continues it
                workload.answered(workload.prompts[r.prompt_idx], r.token_ids)
            writer.put(r)
        probe_writer = on_probe = None
        if "probes" in self.outs and path in ("baseline", "disagg") and not rep:  # P/D probes against the baseline's
            probe_writer = RowWriter(self.outs["probes"], lambda r: row(
                self.settings, self.run_id, f"{path}_probe", r, self.probe_prompts[r.prompt_idx],
                self.base_probes.get(r.index) if path == "disagg" else None, stats,
                1 / cfg.serve.probes.interval_s), stats)

            def on_probe(r: ClientResult) -> None:
                if path == "baseline":
                    self.base_probes[r.index] = r
                probe_writer.put(r)
        counted = path == "disagg" and not self.client.deployment.external
        before = self.client.deployment.token_sources() if counted else {}
        t0 = time.monotonic()
        try:
            results = self.client.load(path if not rep else f"{path}-r{rep}", self.client.deployment.urls[target],
                                       schedule if path != "disagg" else scenario_schedule(cfg, schedule, workload),
                                       on_result=on_result, on_probe=on_probe)
        finally:
            abandon, failed = sys.exc_info()[0] is not None, None
            for w in (writer, probe_writer):  # each closed (its rows written) before either says what failed
                try:
                    if w is not None:
                        w.close(abandon=abandon)
                except RuntimeError as e:
                    failed = failed or e
            if failed is not None:
                raise failed
        self.timings[f"{path}_s"] = self.timings.get(f"{path}_s", 0.0) + time.monotonic() - t0
        if counted:
            for source, v in self.client.deployment.token_sources().items():
                self.token_sources[source] = self.token_sources.get(source, 0.0) + v - before.get(source, 0.0)
        if first_baseline:
            self.base = {r.index: r for r in results}
