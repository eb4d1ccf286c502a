"""Engines kept between the offline runs of one process (run.reuse_engines): the jobs of a Hydra
multirun with the basic launcher, a bench script's runs, a test session's.

A set of engines (the baseline; or the prefill and decode engines with the KV channel between
them) is taken by the next run whose set has the same key: every vLLM argument, the environment
and the GPU of each engine, the connector's configuration included, save the paths that name the
run that started it (`engine_key`). Anything else starts fresh. How many sets of each slot stay
alive is run.keep_engine_sets (default 1): before a fresh set starts, the sets of its slot used
least recently are stopped until it fits, so with 1 no more engines are alive than one run starts
(what a GPU's memory allows), and with 2 runs that alternate between two configurations (a test
session) keep both. A run hands its baseline back once the baseline's passes have ended, its P/D
pair only when every request ended with nothing held (offline/run.py); the rest are stopped as
before. What is kept is stopped at exit (atexit; the engines also die with this process:
PR_SET_PDEATHSIG). A pair on either side of a link (link=veth) holds the link until it is
stopped: the next run takes both, the link reshaped to its speed (harness/link.py).

Why reuse changes no result: each run empties the kept engines' prefix caches before its first
request, its requests carry transfer ids of its own and name its own records files
(kv_transfer_params' records), and a fresh engine is emptied the same way after its own warm-up.
"""

from __future__ import annotations

import atexit
import json
from collections.abc import Callable
from dataclasses import dataclass

from harness.engine_process import EngineProcess
from transfer_strategies.connector_config import RUN_PATHS

# what names the run that started an engine, not how it is configured: vLLM's NIXL side channel
# (a port chosen per run; the harness hands it to nothing else)
RUN_ENV = ("VLLM_NIXL_SIDE_CHANNEL_PORT",)


def engine_key(specs: list[tuple[dict, dict, int]]) -> str:
    """The key of a set of engines: [(vllm arguments, environment, gpu)] of each, less what names
    the run that started them (connector_config.RUN_PATHS, RUN_ENV)."""
    out = []
    for args, env, gpu in specs:
        args = dict(args)
        if isinstance(args.get("kv_transfer_config"), dict):
            args["kv_transfer_config"] = _without_run_paths(args["kv_transfer_config"])
        env = {k: v for k, v in env.items() if k not in RUN_ENV}
        out.append({"args": args, "env": env, "gpu": gpu})
    return json.dumps(out, sort_keys=True, default=str)


def _without_run_paths(kv: dict) -> dict:
    """A kv_transfer_config without the harness's run paths, in vLLM's MultiConnector's connectors too."""
    extra = dict(kv.get("kv_connector_extra_config") or {})
    if isinstance(extra.get("harness"), dict):
        extra["harness"] = {k: v for k, v in extra["harness"].items() if k not in RUN_PATHS}
    if isinstance(extra.get("connectors"), list):
        extra["connectors"] = [_without_run_paths(c) if isinstance(c, dict) else c for c in extra["connectors"]]
    return dict(kv, kv_connector_extra_config=extra)


@dataclass
class KeptEngines:
    key: str
    engines: list[EngineProcess]
    cleanup: Callable[[], None]  # what stopping them leaves to remove (the channel's files)

    def alive(self) -> bool:
        return all(e.proc.is_alive() for e in self.engines)

    def stop(self) -> None:
        try:
            for e in self.engines:
                e.stop(grace_s=1)
        finally:
            self.cleanup()


def _make_room(kept: list[KeptEngines], capacity: int) -> None:
    """Stops the least recently used sets until one more fits within capacity."""
    while len(kept) >= capacity:
        kept.pop(0).stop()


class EnginePool:
    def __init__(self):
        # slot ("baseline", "disagg") -> its kept sets, the least recently used first
        self._kept: dict[str, list[KeptEngines]] = {}

    def take(self, slot: str, key: str, capacity: int = 1) -> KeptEngines | None:
        """The kept set of this slot with key `key` if every engine of it is alive (it is then
        the caller's); else None, once the slot's sets used least recently are stopped until a
        fresh set fits beside the rest (at most `capacity` sets alive)."""
        kept = self._kept.setdefault(slot, [])
        found = next((k for k in kept if k.key == key), None)
        if found is not None:
            kept.remove(found)
            if found.alive():
                return found
            found.stop()
        _make_room(kept, capacity)
        return None

    def keep(self, slot: str, key: str, engines: list[EngineProcess], cleanup: Callable[[], None],
             capacity: int = 1) -> None:
        """Hands a set back for the next run (the slot's least recently used sets stopped beyond
        `capacity`)."""
        kept = self._kept.setdefault(slot, [])
        _make_room(kept, capacity)
        kept.append(KeptEngines(key, engines, cleanup))

    def pids(self) -> set[int]:
        return {e.proc.pid for sets in self._kept.values() for kept in sets for e in kept.engines}

    def close(self, slot: str | None = None) -> None:
        """Stops every kept engine (of one slot)."""
        for name in [slot] if slot else list(self._kept):
            sets = self._kept.pop(name, [])
            while sets:
                sets.pop().stop()


POOL = EnginePool()
atexit.register(POOL.close)
