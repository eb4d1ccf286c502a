"""A run's configuration as it applies, settled once. checks.py judges the composed config (bad
input: exit 2 and one line, before any engine starts); checked_inputs then settles it here, and
the runners and engine_config read the Settings instead of working the same things out of the raw
config again (when the decode request goes, each engine's vLLM arguments and tensor-parallel
degree, whether the prefill engine's answer is relayed to the decode request, the KV dtype the P/D engines store)."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from harness.records.kv_geometry import KVGeometry, kv_geometry

ROLES = ("baseline", "prefill", "decode")


@dataclass(frozen=True)
class Settings:
    cfg: DictConfig  # the composed config, for the values used as they are (sampling, serve.*, ...)
    device: str  # cpu or cuda, as resolved
    decode_submit: str  # early or after_prefill, as it applies to the strategy
    relays: bool  # the prefill engine's answer (where its KV is) is relayed to the decode request: vLLM's NIXL
    overrides: dict[str, dict]  # each engine's vLLM arguments on top of `engine` (engine_overrides)
    tp: tuple[int, int]  # the prefill and decode engines' tensor-parallel degrees
    kv_cache_dtype: str | None  # the KV dtype the P/D engines store where the baseline's differs
    kv_geometry: KVGeometry | None  # the model's, from its config.json (None: not a local folder)

    @property
    def early(self) -> bool:
        return self.decode_submit == "early"

    def tp_of(self, role: str) -> int:
        return self.overrides[role].get("tensor_parallel_size") or 1


def settle(cfg: DictConfig, device: str) -> Settings:
    """The Settings of a config that passed every check (checks.checked_inputs)."""
    return Settings(cfg=cfg, device=device, decode_submit=decode_submit(cfg), relays=relays(cfg.strategy),
                    overrides={role: engine_overrides(cfg, role) for role in ROLES},
                    tp=(tp_degree(cfg, "prefill"), tp_degree(cfg, "decode")), kv_cache_dtype=stored_kv_dtype(cfg),
                    kv_geometry=kv_geometry(str(cfg.model.path), str(cfg.engine.dtype)))


def engine_overrides(cfg: DictConfig, role: str | None) -> dict:
    """The vllm.LLM arguments given for one engine on top of `engine`: engine.extra, then
    engines.<role> (role: baseline, prefill or decode; None: engine.extra only)."""
    args = OmegaConf.to_container(cfg.engine.extra, resolve=True) if cfg.engine.get("extra") else {}
    own = cfg.get("engines", {}).get(role) if role else None
    args.update(OmegaConf.to_container(own, resolve=True) if own else {})
    return args


def tp_degree(cfg: DictConfig, role: str) -> int:
    return engine_overrides(cfg, role).get("tensor_parallel_size") or 1


def submits_early(strategy: DictConfig) -> bool:
    """Whether the decode request can go with the prefill request: this project's (push)
    connectors park it in vLLM until its KV arrives; vLLM's NIXL connectors need the
    prefill engine's answer, and its example connector looks for the KV once, at admission."""
    return bool(strategy.module) and strategy.get("handoff", "push") == "push"


# how a prompt's decode request learns where its KV is (a strategy YAML's `handoff`)
HANDOFFS = {
    "push": "this project's connectors: both requests carry one transfer id, the prefill worker sends",
    "relay": "vLLM's NIXL connectors: the prefill engine's answer goes with the decode request",
    "bootstrap": "vLLM's Mooncake connector: the decode request names the prefill engine and its bootstrap server",
}


def handoff(strategy: DictConfig) -> str:
    return strategy.get("handoff", "push")


def relays(strategy: DictConfig) -> bool:
    return handoff(strategy) == "relay"


def observed(cfg: DictConfig) -> bool:
    """Whether vLLM's own connector of this run is composed with the observer, which digests the
    KV it moves on both engines (transfer_strategies/observer.py): a strategy YAML's
    `observed: true`, with check.digests on."""
    return not cfg.strategy.module and bool(cfg.strategy.get("observed")) and bool(cfg.check.digests)


def writes_records(cfg: DictConfig) -> bool:
    """Whether every transfer of this run has transfer and compute records: this project's
    connectors, or vLLM's with the observer."""
    return bool(cfg.strategy.module) or observed(cfg)


def decode_submit(cfg: DictConfig) -> str:
    """run.decode_submit as it applies to this strategy: "early" or "after_prefill"."""
    return cfg.run.get("decode_submit") or ("early" if submits_early(cfg.strategy) else "after_prefill")


def stored_kv_dtype(cfg: DictConfig) -> str | None:
    """The KV dtype the decode engine stores where the baseline's differs (vLLM's kv_cache_dtype,
    `engines.prefill={kv_cache_dtype:fp8} engines.decode={kv_cache_dtype:fp8}`): the other way
    users shrink KV, judged as a lossy strategy is (outputs compared, not required to match)."""
    mine = engine_overrides(cfg, "decode").get("kv_cache_dtype") or "auto"
    return mine if mine != (engine_overrides(cfg, "baseline").get("kv_cache_dtype") or "auto") else None


def instance_counts(cfg: DictConfig) -> dict[str, int]:
    """Each side's instances: serve.baseline_instances=matched gives the baseline as many as the
    P/D side has (2 against 1P1D, 3 against 2P1D), so a curve compares equal hardware."""
    s = cfg.serve
    p, d = s.prefill_instances, s.decode_instances
    return {"baseline": p + d if s.baseline_instances == "matched" else s.baseline_instances, "prefill": p, "decode": d}


def first_gpu(settings: Settings, role: str, i: int) -> int:
    """The first GPU of instance i of a side (its workers take the next ones, as many as its TP
    degree): the side's device.<role>_gpu + i x that degree, so two baselines from GPU 0 are on
    GPUs 0 and 1, two TP 2 prefill instances from GPU 0 on GPUs 0-1 and 2-3 (counted modulo the
    GPUs there are: on one GPU every instance shares it)."""
    return settings.cfg.device[f"{role}_gpu"] + i * settings.tp_of(role)
