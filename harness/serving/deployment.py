"""The instances and routers of a runner=serve run (ServingDeployment): `vllm serve` instances
(harness/serving/instances.py) with the offline runner's engine arguments and connector
configuration (harness/engine_config.py), a router in front of the baseline instances and one in
front of the prefill and decode instances (harness/serving/router.py)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness import process_group
from harness.engine_config import bootstrap_url, connector_env, engine_args, engine_env, transfer_config
from harness.records.files import write_json
from harness.serving.instances import InstanceDied, ServerProcess, router_process, vllm_instance
from harness.settings import Settings, first_gpu, handoff, instance_counts
from transfer_strategies.transport import remove_leftovers


def gpu_count() -> int:
    import torch

    return max(torch.cuda.device_count(), 1)


def instance_names(side: str, count: int) -> list[str]:
    """prefill, decode with one instance a side; prefill0, prefill1, ... with more."""
    return [side] if count == 1 else [f"{side}{i}" for i in range(count)]


class ServingDeployment:
    """The instances and routers this run started (none with external endpoints), and the URLs
    the load goes to. serve.prefill_instances x serve.decode_instances behind the P/D router:
    with this project's (push) strategies each prefill instance has a KV channel to each decode
    instance (transport/fan_out.py, fan_in.py), and the router tells the prefill instance which
    one a request's decode half went to; vLLM's NIXL connectors take any shape."""

    def __init__(self, settings: Settings, run_dir: Path, baseline: bool = True):
        """baseline: also the colocated instances and their router (python -m harness.serving.deploy
        may go without)."""
        cfg, device = settings.cfg, settings.device
        self.settings, self.cfg, self.run_dir = settings, cfg, run_dir
        self.servers: dict[str, ServerProcess] = {}
        self.semaphores_before = process_group.semaphores()
        s = cfg.serve
        counts = instance_counts(cfg)
        self.baseline_names = instance_names("baseline", counts["baseline"]) if baseline else []
        self.prefill_names = instance_names("prefill", counts["prefill"])
        self.decode_names = instance_names("decode", counts["decode"])
        # one KV channel per (prefill, decode) instance pair (push strategies): prefill instance p
        # lists its decode peers in the router's --decode order, which is what a request's peer counts in
        self.channels = {(p, d): run_dir / f"kv-channel-{p}-{d}.port"
                         for p in self.prefill_names for d in self.decode_names}
        self.rendezvous = list(self.channels.values())
        self.stats_paths = [run_dir / f"{n}-transfers.jsonl" for n in (*self.prefill_names, *self.decode_names)]
        ends = s.endpoints
        self.external = ends.baseline is not None
        if self.external:
            self.urls = {"baseline": ends.baseline.rstrip("/"), "disagg": ends.disagg.rstrip("/")}
            return
        for path in self.rendezvous:
            path.unlink(missing_ok=True)
        def ends(paths: list[Path]) -> Path | list[Path]:  # one channel: a path, as offline
            return paths if len(paths) > 1 else paths[0]

        kv = {p: transfer_config(settings, "prefill", ends([self.channels[p, d] for d in self.decode_names]),
                                 run_dir / f"{p}-transfers.jsonl") for p in self.prefill_names}
        kv.update({d: transfer_config(settings, "decode", ends([self.channels[p, d] for p in self.prefill_names]),
                                      run_dir / f"{d}-transfers.jsonl") for d in self.decode_names})
        self.bootstrap: dict[str, str | None] = {}  # a prefill instance's bootstrap server (handoff bootstrap)
        for names in (self.baseline_names, self.prefill_names, self.decode_names):
            for i, name in enumerate(names):
                role = name.rstrip("0123456789")
                gpu = first_gpu(settings, role, i)
                env = engine_env(settings.cfg, device, gpu if device != "cuda" else gpu % gpu_count())
                if role == "decode" and cfg.run.get("no_transfer_control"):
                    env["VLLM_SERVER_DEV_MODE"] = "1"  # its /reset_prefix_cache, before the control pass
                if name in kv:
                    env.update(connector_env(settings, role))
                    if "engine_id" in kv[name]:  # each prefill instance its own (the router asks its bootstrap server)
                        kv[name]["engine_id"] = name
                    self.bootstrap[name] = bootstrap_url(env)
                kv_args = {"kv_transfer_config": kv[name]} if name in kv else {}
                self.servers[name] = vllm_instance(name, {**engine_args(settings, role), **kv_args}, env,
                                                   run_dir / f"{name}.log")
        self.urls: dict[str, str] = {}  # once started: the routers'

    def start(self, timeout_s: float) -> None:
        if self.external:
            return
        instances = list(self.servers.values())
        for s in instances:
            s.start()
        self.write_pids()
        deadline = time.monotonic() + timeout_s
        for s in instances:
            s.wait_healthy(max(deadline - time.monotonic(), 1.0))
        # the routers once the instances' ports are theirs (an instance whose port was taken has another)
        cfg, s = self.cfg, self.cfg.serve
        hang_s = max(cfg.run.request_timeout_s, cfg.run.startup_timeout_s)
        router_args = ["--handoff", handoff(cfg.strategy), "--decode-submit", self.settings.decode_submit,
                   *[a for p in self.prefill_names if self.bootstrap.get(p)
                     for a in ("--bootstrap", self.bootstrap[p])],
                   # the client holds requests to run.request_timeout_s; the router only drops upstreams
                   # that hang (the warm-up's first use may take as long as a start-up)
                   "--policy", s.policy, *(["--prefill-policy", s.prefill_policy] if s.prefill_policy else []),
                   "--timeout-s", str(hang_s),
                   *(["--stream-prefill-token"] if s.stream_prefill_token else []),
                   *(["--corrupt"] if cfg.check.corrupt else []),
                   "--pd-policy", s.pd_policy, "--min-prompt-tokens", str(s.selective.min_prompt_tokens),
                   "--min-uncached-tokens", str(s.selective.min_uncached_tokens)]
        routers = {"router": "disagg"}
        if self.baseline_names:
            self.servers["baseline_router"] = router_process(
                "baseline_router", [], [self.servers[b].url for b in self.baseline_names],
                self.run_dir / "baseline_router.log", "--policy", s.policy, "--timeout-s", str(hang_s))
            routers["baseline_router"] = "baseline"
        self.servers["router"] = router_process(
            "router", [self.servers[p].url for p in self.prefill_names],
            [self.servers[d].url for d in self.decode_names], self.run_dir / "router.log", *router_args)
        for name in routers:
            self.servers[name].start().wait_healthy(60)
        self.urls = {path: self.servers[name].url for name, path in routers.items()}
        self.write_pids()

    def write_pids(self) -> None:
        """servers.json: each server's process (the leader of its process group), URL and log."""
        write_json(self.run_dir / "servers.json", {n: {"pid": s.proc.pid, "url": s.url, "log": str(s.log_path)}
                                                   for n, s in self.servers.items() if s.proc is not None})

    async def watchdog(self) -> None:
        """Raises InstanceDied as soon as a server this run started exits."""
        while True:
            for s in self.servers.values():
                if not s.alive():
                    raise InstanceDied(s.failure_message())
            await asyncio.sleep(0.5)

    def kv_usage(self) -> dict[str, float | None]:
        """vLLM's KV cache usage (0 to 1) of the prefill and decode instances once idle: above 0
        after every request ended means blocks left held."""
        out = {}
        for name in (*self.prefill_names, *self.decode_names):
            usage = None
            for _ in range(50):  # the last requests' blocks are freed by the engines' next steps
                usage = self.servers[name].metric("vllm:kv_cache_usage_perc")
                if not usage:
                    break
                time.sleep(0.1)
            out[name] = usage
        return out

    def reset_decode_caches(self, timeout_s: float = 30.0) -> None:
        """Empties each decode instance's prefix cache (vLLM's /reset_prefix_cache, a dev-mode
        endpoint), so that the no-transfer control computes every prompt itself rather than
        finding the KV the P/D pass moved there. vLLM refuses while blocks are held (the last
        requests' are freed by the engine's next steps): asked again until timeout_s."""
        for name in self.decode_names:
            url = self.servers[name].url + "/reset_prefix_cache"
            deadline = time.monotonic() + timeout_s
            while True:
                with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=10) as r:
                    if json.loads(r.read() or b"{}").get("success", True):
                        break
                if time.monotonic() > deadline:
                    raise InstanceDied(f"{name} would not empty its prefix cache within {timeout_s:.0f} s")
                time.sleep(0.2)

    def token_sources(self) -> dict[str, float]:
        """vLLM's own count of the decode instances' prompt tokens by where they came from
        (vllm:prompt_tokens_by_source: local_compute, local_cache_hit, external_kv_transfer),
        summed over the instances, once two reads 0.2 s apart agree (the counts reach the API
        server with the steps' stats); empty where vLLM exports none."""
        last = None
        for _ in range(25):
            now: dict[str, float] = {}
            for name in self.decode_names:
                for source, v in self.servers[name].metric_by("vllm:prompt_tokens_by_source_total", "source").items():
                    now[source] = now.get(source, 0.0) + v
            if now == last:
                break
            last = now
            time.sleep(0.2)
        return last or {}

    def stop(self, grace_s: float) -> None:
        """The routers, then every instance at once: one by one, five instances given grace_s each
        to shut down can take over a minute on the loaded 2-core machine (a Ctrl-C in one make test
        outlasted the test's 60 s wait)."""
        routers = [s for name, s in self.servers.items() if name.endswith("router")]
        for s in reversed(routers):  # added last: before the instances behind them
            s.stop(grace_s)
        instances = [s for s in self.servers.values() if s not in routers]
        with ThreadPoolExecutor(max(len(instances), 1)) as pool:
            list(pool.map(lambda s: s.stop(grace_s), instances))  # every one stopped; then the first error, if any
        if not self.external:
            remove_leftovers(self.rendezvous)
            process_group.remove_unmapped(process_group.semaphores() - self.semaphores_before)
