"""Engines kept between the offline runs of one process (run.reuse_engines): the jobs of a Hydra
multirun with the basic launcher, a bench script's runs, a test session's.

A set of engines (the baseline; or the prefill and decode engines with the KV channel between
them) is taken by the next run whose set has the same key: every vLLM argument, the environment
and the GPU of each engine, the connector's configuration included, save the paths that name the
run that started it (`engine_key`). Anything else starts fresh: the set kept in that slot is
stopped first, so no more engines are alive than one run starts. A run hands its sets back only
when it ended normally with nothing held (offline/run.py); the rest are stopped as before. What
is kept is stopped at exit (atexit; the engines also die with this process: PR_SET_PDEATHSIG).

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

# kv_transfer_config's harness values that name the run that started the engines: a later run's
# requests name their own records files, and the channel is open already
RUN_PATHS = ("rendezvous", "stats_path")


def engine_key(specs: list[tuple[dict, dict, int]]) -> str:
    """The key of a set of engines: [(vllm arguments, environment, gpu)] of each."""
    out = []
    for args, env, gpu in specs:
        args = dict(args)
        kv = args.get("kv_transfer_config")
        if isinstance(kv, dict) and isinstance((kv.get("kv_connector_extra_config") or {}).get("harness"), dict):
            extra = dict(kv["kv_connector_extra_config"])
            extra["harness"] = {k: v for k, v in extra["harness"].items() if k not in RUN_PATHS}
            args["kv_transfer_config"] = dict(kv, kv_connector_extra_config=extra)
        out.append({"args": args, "env": env, "gpu": gpu})
    return json.dumps(out, sort_keys=True, default=str)


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


class EnginePool:
    def __init__(self):
        self._kept: dict[str, KeptEngines] = {}  # slot ("baseline", "disagg") -> its set

    def take(self, slot: str, key: str) -> KeptEngines | None:
        """The kept set of this slot if its key is `key` and every engine of it is alive (it is
        then the caller's); else None, and whatever was kept there is stopped."""
        kept = self._kept.pop(slot, None)
        if kept is None:
            return None
        if kept.key == key and kept.alive():
            return kept
        kept.stop()
        return None

    def keep(self, slot: str, key: str, engines: list[EngineProcess], cleanup: Callable[[], None]) -> None:
        """Hands a set back for the next run (a set already kept in the slot is stopped)."""
        old = self._kept.pop(slot, None)
        if old is not None:
            old.stop()
        self._kept[slot] = KeptEngines(key, engines, cleanup)

    def pids(self) -> set[int]:
        return {e.proc.pid for kept in self._kept.values() for e in kept.engines}

    def close(self) -> None:
        """Stops every kept engine."""
        while self._kept:
            _, kept = self._kept.popitem()
            kept.stop()


POOL = EnginePool()
atexit.register(POOL.close)
