"""Everything about a run that can be judged before any engine starts: the config's values, the
device, the strategy's connector, vLLM's block-size rule, the model's tokenizer and the prompts.
A failure here is bad input: one line, exit 2, nothing started. What passes is settled once
(checked_inputs: harness/settings.py), for the runners to read.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from harness import scenario
from harness.gpu_fit import gpu_memory_gib, unfit
from harness.records.kv_geometry import kv_geometry
from harness.scenario import ScenarioError
from harness.settings import (
    HANDOFFS,
    Settings,
    engine_overrides,
    handoff,
    observed,
    settle,
    submits_early,
    tp_degree,
)
from harness.workload import Workload, build_workload
from transfer_strategies.connector_config import ContractError, HarnessSettings, NoParams, TransportSettings, parse
from transfer_strategies.kv_transfer_params import CORRUPT, FAULT, RECORDS


class ConfigError(ValueError):
    pass


def resolve_device(cfg: DictConfig) -> str:
    import torch

    kind = cfg.device.type
    if kind == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda but torch sees no GPU: use device=cpu or device=auto")
    if kind not in ("cpu", "cuda"):
        raise ConfigError(f"device.type must be auto, cpu or cuda, got {kind!r}")
    if kind == "cuda":
        for engine in ("baseline", "prefill", "decode"):
            gpu = cfg.device[f"{engine}_gpu"]
            if not 0 <= gpu < torch.cuda.device_count():
                raise ConfigError(f"device.{engine}_gpu={gpu}, but torch sees {torch.cuda.device_count()} GPU(s) "
                                  f"(indices count the GPUs in CUDA_VISIBLE_DEVICES)")
            tp = tp_degree(cfg, engine)
            if isinstance(tp, int) and tp > torch.cuda.device_count():
                raise ConfigError(f"tensor_parallel_size={tp} on the {engine} engine needs {tp} GPUs, but torch sees "
                                  f"{torch.cuda.device_count()} (a worker per GPU)")
    return kind


def not_a_strategy_param(key: str) -> str | None:
    """Where a value given as strategy.params.<key> belongs, if it is a harness, transport or
    per-request value (connector_config.py, kv_transfer_params.py): the strategy would never see
    it, and the user meant the other."""
    harness = {f.name: f.metadata["config"] for f in dataclasses.fields(HarnessSettings)}
    if key in harness:
        return f"use {harness[key]}" if harness[key] else "the harness sets it"
    if key == "transport":
        return "use transport=staged|gloo"
    if key in {f.name for f in dataclasses.fields(TransportSettings)}:
        return f"use transport.{key}"
    return {CORRUPT: "use check.corrupt", FAULT: "use scenario.fault", RECORDS: "the harness sets it"}.get(key)


def params_type(connector: type) -> type:
    """The dataclass a connector class declares for its strategy.params (base.py)."""
    return getattr(connector, "Params", NoParams)


def check_strategy_params(strategy: DictConfig, connector: type | None) -> None:
    """strategy.params against the parameters the connector declares (names, types, values)."""
    if connector is None:  # vLLM's own: its params go to it as they are
        return
    params = OmegaConf.to_container(strategy.params, resolve=True) if strategy.params else {}
    try:
        parse(params_type(connector), params, "strategy.params")
    except ContractError as e:
        raise ConfigError(f"strategy {strategy.name!r}: {e}") from None


def check_settings(cfg: DictConfig) -> None:
    """The values that need no device, model or vLLM to judge."""
    if cfg.link.kind != "none" and cfg.runner.name != "offline":
        raise ConfigError(f"link={cfg.link.kind} runs with runner=offline (the serving runner's instances do not "
                          f"enter network namespaces)")
    max_tokens = cfg.sampling.max_tokens
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise ConfigError(f"sampling.max_tokens must be an integer >= 1 (the decode engine generates them), "
                          f"got {max_tokens!r}")
    block_size = cfg.engine.block_size
    if not isinstance(block_size, int) or block_size < 1:
        raise ConfigError(f"engine.block_size must be a positive integer, got {block_size!r}")
    warmup = cfg.run.warmup_requests
    if not isinstance(warmup, int) or warmup < 0:
        raise ConfigError(f"run.warmup_requests must be an integer >= 0, got {warmup!r}")
    keep = cfg.run.keep_engine_sets
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
        raise ConfigError(f"run.keep_engine_sets must be an integer >= 1 (sets of engines kept alive for later "
                          f"runs; run.reuse_engines=false keeps none), got {keep!r}")
    if not cfg.engine.kv_cache_gib > 0:
        raise ConfigError(f"engine.kv_cache_gib must be > 0, got {cfg.engine.kv_cache_gib!r}")
    staging_mb = cfg.transport.get("staging_mb")
    if staging_mb is not None and (not isinstance(staging_mb, int) or staging_mb < 1):
        raise ConfigError(f"transport.staging_mb must be a positive integer (MiB) or null, got {staging_mb!r}")
    try:  # as the connectors will read it (was a traceback from the first engine's settings)
        transport = parse(TransportSettings, OmegaConf.to_container(cfg.transport, resolve=True), "transport")
    except ContractError as e:
        raise ConfigError(str(e)) from None
    if transport.kind == "nixl" and importlib.util.find_spec("nixl") is None:
        raise ConfigError("transport=nixl needs the Python package 'nixl', which is not installed: `make setup` "
                          "installs it on CPU machines; elsewhere pip install nixl")
    s = cfg.strategy
    submit = cfg.run.get("decode_submit")
    if submit not in (None, "early", "after_prefill"):
        raise ConfigError(f"run.decode_submit must be early, after_prefill or null (the strategy's way), "
                          f"got {submit!r}")
    if submit == "early" and not submits_early(s):
        raise ConfigError(f"run.decode_submit=early: strategy {s.name!r} ({s.connector}) needs the prefill engine's "
                          f"answer before the decode request can go (use run.decode_submit=after_prefill)")
    drop = cfg.check.get("max_accuracy_drop")
    if drop is not None and (isinstance(drop, bool) or not isinstance(drop, (int, float)) or not 0 <= drop <= 1):
        raise ConfigError(f"check.max_accuracy_drop must be a number from 0 to 1 (a share of exact matches) or null, "
                          f"got {drop!r}")
    policy = cfg.run.get("kv_load_failure_policy")
    if policy not in (None, "fail", "recompute"):
        raise ConfigError(f"run.kv_load_failure_policy must be fail, recompute or null (vLLM's default), "
                          f"got {policy!r}")
    try:
        scenario.check(cfg)
    except ScenarioError as e:
        raise ConfigError(str(e)) from None
    check_parallelism(cfg)
    check_same_layout(cfg)
    if not s.module and cfg.check.corrupt and not observed(cfg):
        raise ConfigError(f"check.corrupt=true damages the KV this project's connectors move, or the observer beside "
                          f"vLLM's (a strategy with `observed: true`, and check.digests=true); "
                          f"strategy {s.name!r} is vLLM's own {s.connector}, unobserved here")
    for key in s.params or {}:
        instead = not_a_strategy_param(key) if s.module else None
        if instead:
            raise ConfigError(f"strategy.params.{key} is not a strategy parameter: {instead}")


def check_parallelism(cfg: DictConfig) -> None:
    """Tensor parallelism per engine (engine.extra, engines.<role>): this project's connectors
    move each worker's KV heads to the decode workers that hold them (transfer_strategies/tp.py),
    for degrees the model's KV heads allow, offline and in serving mode (any number of
    instances a side). Pipeline and data parallelism are not supported by them (vLLM's own
    connectors take any degree)."""
    from transfer_strategies.tp import degree_problem

    if not cfg.strategy.module:
        return
    geometry = kv_geometry(str(cfg.model.path), str(cfg.engine.dtype))
    heads = geometry.kv_heads if geometry else None
    degrees = {}
    for role in ("baseline", "prefill", "decode"):
        args = engine_overrides(cfg, role)
        for key in ("pipeline_parallel_size", "data_parallel_size"):
            if role != "baseline" and (args.get(key) or 1) > 1:
                raise ConfigError(f"{key}={args[key]} on the {role} engine: this project's strategies move KV between "
                                  f"tensor-parallel workers only; use {key}=1 or one of vLLM's own connectors "
                                  f"(strategy=vllm_nixl)")
        tp = args.get("tensor_parallel_size") or 1
        if not isinstance(tp, int) or tp < 1:
            raise ConfigError(f"tensor_parallel_size on the {role} engine must be an integer >= 1, got {tp!r}")
        problem = degree_problem(tp, heads) if heads else None
        if problem:
            raise ConfigError(f"{role} engine: {problem} (model {cfg.model.name})")
        degrees[role] = tp


# What the prefill and decode engines' KV blocks must share for this project's strategies, which
# copy whole blocks: the worker's layout handshake would refuse them at start-up anyway.
SAME_LAYOUT = {"block_size": "engine.block_size", "dtype": "engine.dtype", "kv_cache_dtype": None}


def check_same_layout(cfg: DictConfig) -> None:
    if not cfg.strategy.module:
        return
    args = {role: {"block_size": cfg.engine.block_size, "dtype": cfg.engine.dtype, **engine_overrides(cfg, role)}
            for role in ("prefill", "decode")}
    for key, common in SAME_LAYOUT.items():
        p, d = args["prefill"].get(key), args["decode"].get(key)
        if p != d:
            raise ConfigError(f"{key} differs between the prefill engine ({p}) and the decode engine ({d}): this "
                              f"project's strategies copy whole KV blocks of one layout; set it once "
                              f"({common or 'engine.extra'}) for both")


def check_placement(cfg: DictConfig) -> None:
    """transport.address (where the prefill worker listens) and run.netns (where engines run)."""
    import socket
    import subprocess

    netns = cfg.run.get("netns") or {}
    for role in ("prefill", "decode"):
        name = netns.get(role)
        if name and not Path(f"/var/run/netns/{name}").exists():
            raise ConfigError(f"run.netns.{role}={name}: no such network namespace (ip netns add {name}; "
                              f"ip netns list shows them)")
    address = cfg.transport.get("address")
    if not address:
        if any(netns.get(role) for role in ("prefill", "decode")):
            raise ConfigError("run.netns puts an engine in a network namespace of its own: give the address its "
                              "prefill worker listens on, transport.address=HOST:PORT")
        return
    host, _, port = str(address).rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"transport.address must be HOST:PORT (the prefill worker listens there), got {address!r}")
    if not cfg.strategy.module:
        raise ConfigError(f"transport.address is this project's channel; strategy {cfg.strategy.name!r} is vLLM's own "
                          f"{cfg.strategy.connector}, which finds its peer its own way")
    if netns.get("prefill"):  # the address must be one of that namespace's
        shown = subprocess.run(["ip", "-n", netns["prefill"], "-o", "addr"], capture_output=True, text=True).stdout
        if f" {host}/" not in shown:
            raise ConfigError(f"transport.address={address}: {host} is not an address in network namespace "
                              f"{netns['prefill']}, where the prefill engine runs and listens")
        return
    with socket.socket() as s:
        try:
            s.bind((host, 0))
        except OSError as e:
            raise ConfigError(f"transport.address={address}: the prefill engine cannot listen on {host} here "
                              f"({e.strerror}); give an address of this machine") from None


def check_weights(model: DictConfig) -> None:
    """A local model directory that is to be loaded (not dummy weights) holds weight files: a model
    whose weights are made, not committed (models/llama3-8b-kv), says so before any engine starts."""
    local = Path(str(model.path)).expanduser()
    if model.load_format == "dummy" or not local.is_dir():
        return
    if not any(local.glob("*.safetensors")) and not any(local.glob("*.bin")) and not any(local.glob("*.pt")):
        readme = local / "README.md"
        raise ConfigError(f"model directory {local} has no weights (*.safetensors, *.bin, *.pt)"
                          + (f": {readme} says how to make them" if readme.is_file() else "")
                          + "; or model.load_format=dummy for random weights (timing only)")


def load_tokenizer(model_path: str):
    local = Path(model_path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ConfigError(f"model directory {local} has no config.json: not a Hugging Face model directory")
    elif model_path.startswith(("/", ".", "~")) or local.suffix:
        raise ConfigError(f"model path {model_path!r} does not exist: give an existing Hugging Face "
                          f"directory (model.path=/path/to/model) or a hub id (model.path=org/name)")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(local) if local.is_dir() else model_path)
    except Exception as e:  # noqa: BLE001 - whatever transformers raises, the user needs the same advice
        raise ConfigError(f"could not load the tokenizer of model {model_path!r}: {e}\n"
                          f"Give a local Hugging Face directory or a hub id this machine can reach.") from None


def load_connector(strategy: DictConfig) -> type:
    """Import the strategy's connector class now, so a typo fails before any engine starts."""
    logging.getLogger("vllm").setLevel(logging.ERROR)  # engine logs go to the engines' files, not here
    if strategy.get("unavailable"):  # a reference connector the harness cannot run yet says why
        raise ConfigError(f"strategy {strategy.name!r} is not available: {strategy.unavailable}")
    if handoff(strategy) not in HANDOFFS:
        raise ConfigError(f"strategy {strategy.name!r}: handoff {strategy.handoff!r} is one of "
                          + "; ".join(f"{k} ({v})" for k, v in HANDOFFS.items()))
    for module in strategy.get("requires", None) or []:
        package = module.partition(".")[0]
        if importlib.util.find_spec(package) is None:
            raise ConfigError(f"strategy {strategy.name!r} needs the Python package {package!r}, which is not "
                              f"installed: `make setup` installs it on CPU machines; elsewhere pip install {package}")
        if module != package:  # a native module, imported now: a library it loads may be missing
            try:
                importlib.import_module(module)
            except ImportError as e:
                raise ConfigError(f"strategy {strategy.name!r} needs {module!r}, which does not import here ({e}); "
                                  f"`make setup` gives it what it loads on CPU machines") from None
    if not strategy.module:
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

        if strategy.connector not in KVConnectorFactory._registry:
            raise ConfigError(f"strategy {strategy.name!r}: vLLM has no connector {strategy.connector!r}; "
                              f"it has {sorted(KVConnectorFactory._registry)}")
        return None
    try:
        module = importlib.import_module(strategy.module)
    except ImportError as e:
        raise ConfigError(f"strategy {strategy.name!r}: cannot import module {strategy.module!r} ({e}); "
                          f"it must be importable from the project root or PYTHONPATH") from None
    cls = getattr(module, strategy.connector, None)
    if cls is None:
        raise ConfigError(f"strategy {strategy.name!r}: module {strategy.module!r} has no class {strategy.connector!r}")
    return cls


def check_transport(cfg: DictConfig, device: str) -> None:
    """gloo's channel moves payloads from CPU memory: on a GPU the KV moves by CUDA IPC (staged)
    or NIXL, which also crosses a link (link=veth, transport.ifname). Refused here, it was an
    engine dying at start-up with a traceback."""
    from transfer_strategies.transport import carries

    if cfg.strategy.module and not carries(cfg.transport.kind, device):
        raise ConfigError(f"transport={cfg.transport.kind} carries KV in CPU memory; on {device} use transport=staged "
                          f"(CUDA IPC, one host) or transport=nixl (UCX: NVLink, RDMA or TCP on a link)")
    if cfg.transport.get("buffer_device") == "cuda" and device != "cuda":
        raise ConfigError(f"transport.buffer_device=cuda puts NIXL's buffers on a GPU; this run's KV is on {device}: "
                          f"leave it null")


def checked_inputs(cfg: DictConfig) -> tuple[Settings, Workload]:
    """The run's settings and workload, once everything about the config, the model and the prompts
    that can be known before any engine starts has been checked."""
    try:
        check_settings(cfg)
        check_placement(cfg)  # this machine's addresses and namespaces
        device = resolve_device(cfg)
        check_transport(cfg, device)
        workload = build_workload(cfg.workload, load_tokenizer(str(cfg.model.path)))
        check_weights(cfg.model)
        # the model is there (its path is part of the engines' environment): the engines' server
        # imports vLLM from now on, beside the strategy's checks, which import it here
        from harness.engine_config import start_engine_server  # it builds on this module's checks

        start_engine_server(cfg, device)
        connector = load_connector(cfg.strategy)
        check_strategy_params(cfg.strategy, connector)
        settings = settle(cfg, device)
        from harness.geometry_checks import check_geometry  # it builds on this module's checks

        check_geometry(cfg, connector, settings)
    except MissingMandatoryValue as e:
        raise ConfigError(f"{e.full_key} has no value (??? in conf/): give it on the command line, "
                          f"{e.full_key}=...") from None
    workload.check_fits(cfg.engine.max_model_len, cfg.sampling.max_tokens)
    if cfg.runner.name != "serve" and any(p.arrival_s is not None for p in workload.prompts):
        raise ConfigError(f"workload {workload.name!r} replays its arrival times and output lengths: run it with "
                          f"runner=serve")
    if cfg.strategy.get("min_prompt_blocks"):
        workload.check_min_prompt_len(
            cfg.strategy.min_prompt_blocks * cfg.engine.block_size + 2, f"strategy {cfg.strategy.name!r}",
            f"engine.block_size + 2: vLLM's {cfg.strategy.connector} names its files after a prompt's whole "
            f"blocks but its last two tokens, and prompts with none collide")
    if device == "cuda":
        why = unfit(settings, gpu_memory_gib())
        if why:
            raise ConfigError(why)
    return settings, workload
