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

from harness.checks import decode_submit
from harness.engine_config import channel_files, engine_args, engine_env, free_port, pulls, tp_degrees, transfer_config
from harness.engine_process import EngineDied, EngineProcess, wait_ready
from harness.offline.pipeline import Abort, pipeline
from harness.records import write_json
from harness.transfers import TransferStats
from harness.workload import Prompt, Workload
from transfer_strategies.kv_transfer_params import push_params
from transfer_strategies.transport import remove_leftovers

OnFinish = Callable[[Prompt, float, list[dict]], None]


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


class OfflineDeployment:
    """The baseline, prefill and decode engines of one run, child processes of this one: started
    (the prefill and decode engines beside the baseline with run.overlap_startup, else once it has
    stopped), driven a pass at a time, asked what they still hold, and stopped. A prompt's prefill
    and decode requests carry one transfer id (transfer_id), the connectors' records too."""

    def __init__(self, cfg: DictConfig, device: str, run_dir: Path):
        self.cfg, self.device, self.run_dir = cfg, device, run_dir
        self.rendezvous = run_dir / "kv-channel.port"  # the prefill worker writes the port it bound
        for path in channel_files(self.rendezvous, *tp_degrees(cfg)):
            path.unlink(missing_ok=True)
        self.stats_paths = (run_dir / "prefill-transfers.jsonl", run_dir / "decode-transfers.jsonl")
        self.tag = uuid.uuid4().hex[:6]
        self.specs = {
            "baseline": (engine_args(cfg, device, "baseline"), cfg.device.baseline_gpu),
            "prefill": (dict(engine_args(cfg, device, "prefill"),
                             kv_transfer_config=transfer_config(cfg, "prefill", self.rendezvous, self.stats_paths[0])),
                        cfg.device.prefill_gpu),
            "decode": (dict(engine_args(cfg, device, "decode"),
                            kv_transfer_config=transfer_config(cfg, "decode", self.rendezvous, self.stats_paths[1])),
                       cfg.device.decode_gpu),
        }
        self.engines: dict[str, EngineProcess] = {}

    def _start(self, name: str) -> EngineProcess:
        a, gpu = self.specs[name]
        env = engine_env(self.cfg, self.device, gpu, name)
        if name != "baseline" and pulls(self.cfg.strategy):
            # vLLM's NIXL connector listens on a side channel per engine for the handshake
            env.update(VLLM_NIXL_SIDE_CHANNEL_HOST="127.0.0.1", VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_port()))
        self.engines[name] = EngineProcess(name, a, env, self.run_dir / f"{name}.log")
        # who is who while the run goes on (a monitor samples their memory: scripts/bench_soak.py)
        write_json(self.run_dir / "engines.json", {n: e.proc.pid for n, e in self.engines.items()})
        return self.engines[name]

    def start(self) -> float:
        """Starts the baseline engine, and with run.overlap_startup the prefill and decode engines
        beside it; returns the seconds until all of them were ready."""
        t0 = time.monotonic()
        first = [self._start("baseline")]
        if self.cfg.run.overlap_startup:
            first += [self._start("prefill"), self._start("decode")]
        wait_ready(first, self.cfg.run.startup_timeout_s)
        return time.monotonic() - t0

    def start_disagg(self) -> float:
        """Without run.overlap_startup: stops the baseline engine and starts the prefill and decode
        engines; returns the seconds until they were ready (0: already started beside it)."""
        if self.cfg.run.overlap_startup:
            return 0.0
        self.engines["baseline"].stop()
        t0 = time.monotonic()
        wait_ready([self._start("prefill"), self._start("decode")], self.cfg.run.startup_timeout_s)
        return time.monotonic() - t0

    def transfer_id(self, p: Prompt) -> str:
        return f"{self.tag}-{p.index}"

    def baseline_pass(self, workload: Workload, on_finish: OnFinish, phase: str = "") -> None:
        """Every prompt through the baseline engine, prefill and decode in one request."""
        stages = [[(self.engines["baseline"], lambda p, r: sampling_params(self.cfg, self.cfg.sampling.max_tokens))]]
        pipeline(stages, workload, self.cfg.run.request_timeout_s, on_finish, phase=phase)

    def reset_baseline_prefix_cache(self) -> None:
        self.engines["baseline"].reset_prefix_cache()

    def disagg_pass(self, workload: Workload, on_finish: OnFinish, phase: str = "",
                    aborts: dict[int, Abort] | None = None) -> None:
        """Every prompt through the prefill engine, then the decode engine with the prefill's KV
        (decode_submit=early: both requests at once, the decode request parked until its KV is in)."""
        cfg, s, tid = self.cfg, self.cfg.strategy, self.transfer_id
        early = decode_submit(cfg) == "early"
        prefill = (self.engines["prefill"],
                   lambda p, r: sampling_params(cfg, 1, handoff_params(s, "prefill", tid(p), None)))
        decode = (self.engines["decode"], lambda p, r: sampling_params(
            cfg, cfg.sampling.max_tokens, handoff_params(s, "decode", tid(p), r[0], early)))
        stages = [[prefill, decode]] if early else [[prefill], [decode]]
        pipeline(stages, workload, cfg.run.request_timeout_s, on_finish, phase=phase, aborts=aborts)

    def transfer_stats(self) -> TransferStats:
        """A reader of the prefill and decode engines' transfer and compute records."""
        return TransferStats(*self.stats_paths, tp=tp_degrees(self.cfg), expected=bool(self.cfg.strategy.module))

    def usage(self) -> tuple[dict, dict]:
        """The prefill and decode engines' KV blocks in use and what their connector workers hold,
        once every request has finished (settled_usage; vLLM's own connectors: asked once)."""
        return settled_usage([self.engines["prefill"], self.engines["decode"]],
                             settle_s=15.0 if self.cfg.strategy.module else 0.0)

    def stop(self, grace_s: float) -> float:
        """Stops every engine started, then removes what the KV channel leaves behind when its
        engines were killed while opening it; returns the seconds the engines took to stop."""
        t0 = time.monotonic()
        for e in self.engines.values():
            e.stop(grace_s=grace_s)
        stopped_s = time.monotonic() - t0
        remove_leftovers(channel_files(self.rendezvous, *tp_degrees(self.cfg)))
        return stopped_s
