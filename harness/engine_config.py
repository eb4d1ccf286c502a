"""What the harness starts its engines with, for either runner (offline: harness/offline/, serving:
harness/serving/): vLLM's engine arguments, each engine's environment, the KV connector's
kv_transfer_config, and the files and ports of the channel between the prefill and decode engines."""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from harness import PROJECT_ROOT, forkserver
from harness.ceiling import link_ceiling_gbps
from harness.checks import load_connector, params_type
from harness.forkserver import NETNS_ENV
from harness.settings import Settings, engine_overrides, handoff, observed
from transfer_strategies.connector_config import (
    ConnectorConfig,
    HarnessSettings,
    ObserverParams,
    TransportSettings,
    parse,
)
from transfer_strategies.transport.rendezvous import SCHEME


def start_engine_server(cfg: DictConfig, device: str) -> None:
    """On CPU, the server the run's engines and instances are forked from (harness/forkserver.py),
    started now: its import of vLLM (about 6 s on 2 cores) goes on while this process checks the
    strategy, which imports vLLM too (about 5 s). Nothing where no engine starts here."""
    if device == "cpu" and not (cfg.runner.name == "serve" and cfg.serve.endpoints.baseline):
        forkserver.start_server(engine_env(cfg, device, 0))


def engine_args(s: Settings, role: str | None = None) -> dict:
    """vllm.LLM arguments of one engine (role: baseline, prefill or decode; None: engine only)."""
    cfg, device = s.cfg, s.device
    e = cfg.engine
    eager = device == "cpu" if e.enforce_eager is None else e.enforce_eager  # CUDA graphs on a GPU by default
    args = {"model": str(cfg.model.path), "tokenizer": str(cfg.model.path), "dtype": e.dtype,
            "load_format": cfg.model.load_format, "block_size": e.block_size, "max_model_len": e.max_model_len,
            "enforce_eager": eager, "seed": e.seed, "enable_prefix_caching": e.prefix_caching,
            "max_num_seqs": e.max_num_seqs, "disable_log_stats": True}
    # A fixed KV size, the same for every engine (on a GPU, vLLM's own profiling would count the
    # other engines starting beside it)
    args["kv_cache_memory_bytes"] = int(e.kv_cache_gib * 2**30)
    if device == "cuda":
        args["gpu_memory_utilization"] = e.gpu_memory_utilization
    args.update(s.overrides[role] if role else engine_overrides(cfg, None))
    if s.kv_geometry and s.kv_geometry.state_layers:
        # a recurrent state is kept per request, one block of its group, only without prefix caching
        # (with it vLLM keeps states at block boundaries): what transfer_strategies/kv_groups.py moves
        args["enable_prefix_caching"] = False
    elif cfg.strategy.module and role in ("prefill", "decode"):
        # this project's connectors declare SupportsHMA for hybrid models; any other keeps one KV cache
        # group, as vLLM gave a connector without it (sliding-window layers as full attention)
        args.setdefault("disable_hybrid_kv_cache_manager", True)
    if device == "cpu" and s.kv_geometry and s.kv_geometry.kind == "latent":
        # vLLM 0.32's CPU rotary kernel rotates MLA's query, (tokens, heads, 64), wrongly with more
        # than one head; its PyTorch rotary is right (docs/strategies.md, KV geometries)
        args.setdefault("compilation_config", {"custom_ops": ["-rotary_embedding"]})
    if (args.get("tensor_parallel_size") or 1) > 1:
        args.setdefault("distributed_executor_backend", "mp")  # a worker process per rank, on CPU too
    return args


# the prefill engine's id in vLLM, where decode requests name it (handoff bootstrap: Mooncake)
PREFILL_ENGINE_ID = "prefill"


def engine_env(cfg: DictConfig, device: str, gpu: int, role: str | None = None) -> dict:
    """role: baseline, prefill or decode (None: an engine of no role)."""
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # engine core in the engine process: one process to stop
           "TOKENIZERS_PARALLELISM": "false", "GLOO_SOCKET_IFNAME": "lo",
           "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    if Path(str(cfg.model.path)).is_dir():
        env["HF_HUB_OFFLINE"] = "1"
    if role in ("prefill", "decode"):
        netns = cfg.run.get("netns", {}).get(role)
        if netns:
            env[NETNS_ENV] = netns  # engine_process enters it before vLLM starts
        ifname = cfg.transport.get("ifname")
        if ifname or cfg.transport.get("address"):  # gloo (the KV channel's, vLLM's own) on the link between hosts
            env.pop("GLOO_SOCKET_IFNAME")
            if ifname:
                env["GLOO_SOCKET_IFNAME"] = ifname
        if ifname and cfg.transport.kind == "nixl":  # UCX would take shared memory, which no link carries
            # on a GPU, cuda_copy lets UCX's TCP read and write device memory, where transport.buffer_device=cuda
            # keeps NIXL's buffers there (by default they are host memory across a link: nixl_on_host)
            env.update(UCX_TLS="tcp,cuda_copy" if device == "cuda" else "tcp", UCX_NET_DEVICES=ifname)
    if device == "cpu":
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"  # engines share the cores
        # an instance's engine core, TP workers: forked, vLLM imported (harness/vllm_cli.py keep_a_fork_start)
        env["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"
        # OpenMP threads otherwise spin for up to 200 ms after each parallel region, starving
        # the other engines (and the KV receiver thread) on a machine with few cores
        env["OMP_WAIT_POLICY"] = "PASSIVE"
        env["KMP_BLOCKTIME"] = "0"
    else:
        # Own GPU first (vLLM uses cuda:0), the others visible too, so that a staging buffer shared
        # through CUDA IPC from another GPU is read over NVLink peer access. `gpu` counts the GPUs
        # this process sees: under Slurm or submitit CUDA_VISIBLE_DEVICES already names them.
        import torch

        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = visible.split(",") if visible else [str(g) for g in range(torch.cuda.device_count())]
        env["CUDA_VISIBLE_DEVICES"] = ",".join([ids[gpu], *(d for i, d in enumerate(ids) if i != gpu)])
    return env


def connector_env(settings: Settings, role: str) -> dict:
    """What vLLM's own connector of a prefill or decode engine needs in its environment, ports
    picked per engine: NIXL's side channel for its handshake (relay), Mooncake's address and the
    prefill engine's bootstrap server, which tells decode workers where its workers listen (bootstrap)."""
    env = {}
    if settings.relays:
        env.update(VLLM_NIXL_SIDE_CHANNEL_HOST="127.0.0.1", VLLM_NIXL_SIDE_CHANNEL_PORT=str(side_channel_port()))
    if handoff(settings.cfg.strategy) == "bootstrap":
        env.update(VLLM_HOST_IP="127.0.0.1")  # Mooncake's workers' addresses: else the default route's
        if role == "prefill":
            env.update(VLLM_MOONCAKE_BOOTSTRAP_PORT=str(side_channel_port()))
    return env


def bootstrap_url(env: dict) -> str | None:
    """The bootstrap server of a prefill engine started with `env` (connector_env), if it has one."""
    port = env.get("VLLM_MOONCAKE_BOOTSTRAP_PORT")
    return f"http://127.0.0.1:{port}" if port else None


def transfer_config(settings: Settings, engine: str, rendezvous: Path | list[Path], stats_path: Path) -> dict:
    """vLLM's kv_transfer_config for the prefill or decode engine. This project's connectors get
    what the harness sets, the strategy's own params and the transport's settings in sections of
    their own (a strategy param cannot shadow a harness value); vLLM's own connectors (no
    strategy.module) get their params as they are, and where observed (settings.observed) go
    first in a MultiConnector whose second is the observer (transfer_strategies/observer.py)."""
    cfg = settings.cfg
    s = cfg.strategy
    role = s.get("roles", {}).get(engine) or {"prefill": "kv_producer", "decode": "kv_consumer"}[engine]
    params = OmegaConf.to_container(s.params, resolve=True) if s.params else {}
    out = {"kv_connector": s.connector, "kv_role": role, "kv_connector_extra_config": params}
    if not s.module and s.get("cpu_module") and settings.device == "cpu":  # vLLM's class, made to start on the CPU
        out["kv_connector_module_path"] = s.cpu_module
    if handoff(s) == "bootstrap" and engine == "prefill":  # the name decode requests give it (handoff_params)
        out["engine_id"] = PREFILL_ENGINE_ID
    if cfg.run.get("kv_load_failure_policy"):
        out["kv_load_failure_policy"] = cfg.run.kv_load_failure_policy
    if observed(cfg):  # beside the observer, which never loads: vLLM's connector does
        watcher = {"kv_connector": "KVObserver", "kv_connector_module_path": "transfer_strategies.observer",
                   "kv_role": {"prefill": "kv_producer", "decode": "kv_consumer"}[engine],
                   "kv_connector_extra_config": ConnectorConfig(
                       harness_settings(settings, rendezvous, stats_path), TransportSettings(),
                       ObserverParams(observed=s.connector)).to_dict()}
        # the engine's id at the top, which vLLM's MultiConnector hands each connector (it refuses one in both)
        mine = {k: v for k, v in out.items() if k not in ("kv_load_failure_policy", "engine_id")}
        multi = {k: v for k, v in out.items() if k != "kv_connector_module_path"}
        return {**multi, "kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": [mine, watcher]}}
    if not s.module:
        return out
    transport = parse(TransportSettings, OmegaConf.to_container(cfg.transport, resolve=True), "transport")
    strategy = parse(params_type(load_connector(s)), params, "strategy.params")
    out.update(kv_connector_module_path=s.module, kv_connector_extra_config=ConnectorConfig(
        harness_settings(settings, rendezvous, stats_path), transport, strategy).to_dict())
    return out


def harness_settings(settings: Settings, rendezvous: Path | list[Path], stats_path: Path) -> HarnessSettings:
    """The connectors' `harness` section (connector_config.HarnessSettings) for this run."""
    cfg = settings.cfg
    rendezvous = [str(p) for p in rendezvous] if isinstance(rendezvous, list) else str(rendezvous)
    address = cfg.transport.get("address")
    if address:  # the prefill worker listens there, the decode worker connects (rendezvous.py)
        rendezvous = f"{SCHEME}{address}"
    prefill_tp, decode_tp = settings.tp
    return HarnessSettings(
        rendezvous=rendezvous, host=address.rpartition(":")[0] if address else "127.0.0.1",
        stats_path=str(stats_path), prefill_tp=prefill_tp, decode_tp=decode_tp, verify=bool(cfg.check.digests),
        checksums=bool(cfg.check.checksums), timeout_s=float(cfg.run.transfer_timeout_s),
        startup_timeout_s=float(cfg.run.startup_timeout_s), decode_submit=settings.decode_submit)


def link_ceiling(cfg: DictConfig) -> float | str | None:
    """Where the KV crosses a network (transport=gloo, or nixl told an interface, with
    transport.address), that link's own GB/s, measured now between where the two engines run;
    None elsewhere (copy_ceiling_gbps)."""
    address = cfg.transport.get("address")
    if not address or not (cfg.transport.kind == "gloo" or (cfg.transport.kind == "nixl" and cfg.transport.ifname)):
        return None
    return link_ceiling_gbps(address.rpartition(":")[0], dict(cfg.run.get("netns") or {}), cfg.transport.get("ifname"))


def channel_files(rendezvous: Path, p: int, d: int) -> list[Path]:
    """The rendezvous files of a p -> d run's channels (tp.Placement.rendezvous and
    relay_rendezvous: MLA's relay between decode workers; a superset)."""
    if p == d == 1:
        return [rendezvous]
    return ([Path(f"{rendezvous}.p{r}d{q}") for r in range(p) for q in range(d)]
            + [Path(f"{rendezvous}.relay{q}") for q in range(1, d)])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


_reserved: set[int] = set()  # side-channel ports this process handed out


def side_channel_port() -> int:
    """A port free now and below the kernel's ephemeral range, for vLLM's NIXL side channel, which
    an engine binds seconds later: no process binding port 0 meanwhile (the engines starting beside
    it do, for their own sockets) is given it. One from free_port() was, once: the prefill
    engine's handshake listener found it taken, and its decode engine waited for the handshake
    until the run's request timeout."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10000, max(low, 10001))
        if port in _reserved:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _reserved.add(port)
        return port
    return free_port()

