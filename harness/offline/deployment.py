"""The offline runner's three engines (OfflineDeployment): the colocated baseline, and the prefill
and decode engines with the KV channel between them, each an EngineProcess
(harness/engine_process.py) started with harness/engine_config.py's arguments and driven by
offline/pipeline.py; with the requests' parameters (sampling_params, handoff_params) and what the
engines still hold once every request has ended (settled_usage)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig

from harness.engine_config import (
    PREFILL_ENGINE_ID,
    bootstrap_url,
    channel_files,
    connector_env,
    engine_args,
    engine_env,
    transfer_config,
)
from harness.engine_process import EngineDied, EngineProcess, wait_ready
from harness.link import VethLink
from harness.offline.engine_pool import EnginePool, engine_key
from harness.offline.pipeline import pipeline
from harness.records.files import write_json
from harness.records.transfer_records import TransferStats
from harness.scenario import Abort, fault_for
from harness.settings import Settings, handoff, writes_records
from harness.workload import Prompt, Workload
from transfer_strategies.kv_transfer_params import push_params
from transfer_strategies.transport import remove_leftovers

OnFinish = Callable[[Prompt, float, list[dict]], None]


def settled_usage(engines: list[EngineProcess], settle_s: float = 15.0) -> tuple[dict, dict]:
    """Once every request has ended: each engine's KV blocks in use and what its connector
    worker still holds ({name: ...}), asked again for up to settle_s while anything is held (a
    request's late KV, cancelled or timed out, is dropped when it comes; vLLM's NIXL connectors
    free the prefill's blocks on a later step)."""
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
                   early: bool = False, records: Path | None = None, corrupt: bool = False,
                   fault: dict | None = None, bootstrap: str | None = None) -> dict:
    """kv_transfer_params of a request to the prefill or decode engine.
    push (this project's strategies): both requests carry one transfer id; the prefill worker
      sends, the decode worker takes the message with that id. A decode request submitted early
      (with the prefill request) asks to be parked until its KV is in ("load": "async"). Each
      names the file its engine's records go to (records: this run's, engines may be kept); a
      decode request of the negative control asks for its KV to be damaged on arrival (corrupt), a
      prefill request of a fault scenario for its transfer to be faulted (fault: fault_for).
    relay (vLLM's NIXL connectors): the prefill request asks the engine to keep the KV for a remote
      decode; the engine answers where it is, and the decode request carries that answer. Both
      carry the transfer id and records file too, for the observer beside the connector
      (settings.observed; vLLM's connector reads only its own keys), and the decode request the
      negative control's ask.
    bootstrap (vLLM's Mooncake connector): as relay, but the decode request is told up front
      where the KV is: the prefill engine's id and its bootstrap server (`bootstrap`, a URL), whose
      workers it asks to write the KV, which they do once their request has finished."""
    decode = stage == "decode"
    mine = push_params(transfer_id, early=decode and early, records=str(records) if records else None,
                       corrupt=decode and corrupt, fault=None if decode else fault)
    if handoff(strategy) == "push":
        return mine
    if stage == "prefill":
        return {"do_remote_decode": True, **mine}
    if handoff(strategy) == "bootstrap":
        return {"do_remote_prefill": True, "remote_engine_id": PREFILL_ENGINE_ID, "remote_bootstrap_addr": bootstrap,
                **mine}
    params = (prefill_result or {}).get("kv_transfer_params")
    if not params:
        raise EngineDied(f"the prefill engine returned no kv_transfer_params for {transfer_id}: "
                         f"strategy {strategy.name!r} cannot hand the request to the decode engine")
    return {**params, **mine}


# the engines kept and reused together (offline/engine_pool.py): the P/D pair shares its channel
SLOTS = {"baseline": ("baseline",), "disagg": ("prefill", "decode")}


class OfflineDeployment:
    """The baseline, prefill and decode engines of one run, child processes of this one: started
    (the prefill and decode engines beside the baseline with run.overlap_startup, else once it has
    stopped) or taken from `pool` (engines an earlier run of this process kept: run.reuse_engines),
    driven a pass at a time, asked what they still hold, and stopped or kept. A prompt's prefill
    and decode requests carry one transfer id (transfer_id), the connectors' records too."""

    def __init__(self, settings: Settings, run_dir: Path, pool: EnginePool | None = None,
                 link: VethLink | None = None):
        cfg = settings.cfg
        self.settings, self.cfg, self.run_dir, self.pool, self.link = settings, cfg, run_dir, pool, link
        self.rendezvous = run_dir / "kv-channel.port"  # the prefill worker writes the port it bound
        for path in channel_files(self.rendezvous, *settings.tp):
            path.unlink(missing_ok=True)
        self.stats_paths = (run_dir / "prefill-transfers.jsonl", run_dir / "decode-transfers.jsonl")
        self.tag = uuid.uuid4().hex[:6]
        self.specs = {
            "baseline": (engine_args(settings, "baseline"), cfg.device.baseline_gpu),
            "prefill": (dict(engine_args(settings, "prefill"), kv_transfer_config=transfer_config(
                settings, "prefill", self.rendezvous, self.stats_paths[0])), cfg.device.prefill_gpu),
            "decode": (dict(engine_args(settings, "decode"), kv_transfer_config=transfer_config(
                settings, "decode", self.rendezvous, self.stats_paths[1])), cfg.device.decode_gpu),
        }
        self.envs = {name: self._env(name) for name in self.specs}
        self.keys = {slot: engine_key([(*self.specs[n][:1], self.envs[n], self.specs[n][1]) for n in names])
                     for slot, names in SLOTS.items()}
        self.engines: dict[str, EngineProcess] = {}
        self.reused: dict[str, bool] = {}  # engine name -> taken from the pool (not started by this run)
        # what stopping each slot's engines leaves to remove: the channel's files of the run that started them
        self.cleanups = {"baseline": lambda: None,
                         "disagg": lambda: remove_leftovers(channel_files(self.rendezvous, *settings.tp))}

    def _env(self, name: str) -> dict:
        env = engine_env(self.settings.cfg, self.settings.device, self.specs[name][1], name)
        if name != "baseline":
            env.update(connector_env(self.settings, name))
        return env

    def _start(self, *slots: str) -> list[EngineProcess]:
        """The slots' engines: taken from the pool where it kept them for this key (their prefix
        caches emptied), else started; returns those started, to wait for. Every slot is taken
        (what the pool kept under another key stopped) before any engine starts."""
        fresh = [slot for slot in slots if not self._take(slot)]
        if "disagg" in fresh and self.link is not None:  # the pair holds its link until it stops, kept or not
            link, channel_cleanup = self.link.hold(), self.cleanups["disagg"]

            def cleanup():
                try:
                    channel_cleanup()
                finally:
                    link.release()
            self.cleanups["disagg"] = cleanup
        for slot in fresh:
            for name in SLOTS[slot]:
                self.engines[name] = EngineProcess(name, self.specs[name][0], self.envs[name],
                                                   self.run_dir / f"{name}.log")
                self.reused[name] = False
        # who is who while the run goes on (a monitor samples their memory: scripts/bench_soak.py)
        write_json(self.run_dir / "engines.json", {n: e.proc.pid for n, e in self.engines.items()})
        return [self.engines[n] for slot in fresh for n in SLOTS[slot]]

    def _take(self, slot: str) -> bool:
        # a pair listening on a fixed address (transport.address) cannot start beside a kept one holding it
        capacity = 1 if slot == "disagg" and self.cfg.transport.get("address") else self.cfg.run.keep_engine_sets
        kept = self.pool.take(slot, self.keys[slot], capacity) if self.pool is not None else None
        if kept is None:
            return False
        if not all([e.reset_prefix_cache() for e in kept.engines]):  # noqa: C419 - each one emptied
            kept.stop()  # still busy with something: not as a fresh engine would be
            return False
        for e in kept.engines:
            self.engines[e.name], self.reused[e.name] = e, True
        self.cleanups[slot] = kept.cleanup
        return True

    def start(self) -> float:
        """Starts the baseline engine, and with run.overlap_startup the prefill and decode engines
        beside it (or takes them from the pool); returns the seconds until all were ready."""
        t0 = time.monotonic()
        wait_ready(self._start("baseline", *(["disagg"] if self.cfg.run.overlap_startup else [])),
                   self.cfg.run.startup_timeout_s)
        return time.monotonic() - t0

    def start_disagg(self) -> float:
        """Without run.overlap_startup: stops the baseline engine (never kept then: the three did
        not fit together) and starts the prefill and decode engines; returns the seconds until
        they were ready (0: already started beside it)."""
        if self.cfg.run.overlap_startup:
            return 0.0
        self.engines["baseline"].stop()
        t0 = time.monotonic()
        wait_ready(self._start("disagg"), self.cfg.run.startup_timeout_s)
        return time.monotonic() - t0

    def engine_logs(self) -> dict[str, str]:
        """Where each engine's log is: a kept engine's is in the run that started it."""
        return {n: str(e.log_path) for n, e in self.engines.items()}

    def transfer_id(self, p: Prompt) -> str:
        return f"{self.tag}-{p.index}"

    def baseline_pass(self, workload: Workload, on_finish: OnFinish, phase: str = "") -> None:
        """Every prompt through the baseline engine, prefill and decode in one request."""
        stages = [[(self.engines["baseline"], lambda p, r: sampling_params(self.cfg, self.cfg.sampling.max_tokens))]]
        pipeline(stages, workload, self.cfg.run.request_timeout_s, on_finish, phase=phase)

    def reset_baseline_prefix_cache(self) -> None:
        self.engines["baseline"].reset_prefix_cache()

    def control_pass(self, workload: Workload, on_finish: OnFinish, phase: str = "") -> None:
        """run.no_transfer_control: every prompt through the decode engine alone, as the P/D path
        sends them (its concurrency), without kv_transfer_params: no connector moves anything, the
        engine computes each prompt itself (its prefix cache emptied first: the P/D pass's KV)."""
        self.engines["decode"].reset_prefix_cache()
        stages = [[(self.engines["decode"], lambda p, r: sampling_params(self.cfg, self.cfg.sampling.max_tokens))]]
        pipeline(stages, workload, self.cfg.run.request_timeout_s, on_finish, phase=phase)

    def disagg_pass(self, workload: Workload, on_finish: OnFinish, phase: str = "",
                    aborts: dict[int, Abort] | None = None) -> None:
        """Every prompt through the prefill engine, then the decode engine with the prefill's KV
        (decode_submit=early: both requests at once, the decode request parked until its KV is in)."""
        cfg, s, tid = self.cfg, self.cfg.strategy, self.transfer_id
        early = self.settings.early
        sends, receives = self.stats_paths
        bootstrap = bootstrap_url(self.envs["prefill"])
        prefill = (self.engines["prefill"], lambda p, r: sampling_params(
            cfg, 1, handoff_params(s, "prefill", tid(p), None, records=sends, fault=fault_for(cfg, p))))
        decode = (self.engines["decode"], lambda p, r: sampling_params(
            cfg, cfg.sampling.max_tokens,
            handoff_params(s, "decode", tid(p), r[0], early, records=receives, corrupt=cfg.check.corrupt,
                           bootstrap=bootstrap)))
        stages = [[prefill, decode]] if early else [[prefill], [decode]]
        pipeline(stages, workload, cfg.run.request_timeout_s, on_finish, phase=phase, aborts=aborts, request_id=tid)

    def transfer_stats(self) -> TransferStats:
        """A reader of the prefill and decode engines' transfer and compute records."""
        return TransferStats(*self.stats_paths, tp=self.settings.tp, expected=writes_records(self.cfg))

    def usage(self) -> tuple[dict, dict]:
        """The prefill and decode engines' KV blocks in use and what their connector workers hold,
        once every request has finished (settled_usage; vLLM's own connectors: asked once)."""
        return settled_usage([self.engines["prefill"], self.engines["decode"]],
                             settle_s=15.0 if self.cfg.strategy.module else 0.0)

    def stop(self, grace_s: float, keep: set[str] = frozenset()) -> float:
        """Stops every engine (with a pool, the slots in `keep` whose engines are all alive are
        handed back to it instead), then removes what the KV channel leaves behind when its engines
        were killed while opening it; returns the seconds the engines took to stop."""
        t0 = time.monotonic()
        keep = set(keep) if self.pool is not None else set()
        for slot, names in SLOTS.items():
            engines = [self.engines[n] for n in names if n in self.engines]
            if slot in keep and len(engines) == len(names) and all(e.proc.is_alive() for e in engines):
                self.pool.keep(slot, self.keys[slot], engines, self.cleanups[slot], self.cfg.run.keep_engine_sets)
                continue
            try:
                for e in engines:
                    e.stop(grace_s=grace_s)
            finally:
                self.cleanups[slot]()
        return time.monotonic() - t0
