"""What the harness gives this project's connectors when their engines start: vLLM's
`kv_connector_extra_config` holds three sections, one dataclass each, with one set of names and
defaults that both ends use. The harness builds them from its configuration
(harness/engine_config.py `transfer_config`); the connector parses them (`ConnectorConfig.parse`,
in base.py). A key one end writes and the other does not know is an error at start-up, never a
silent default. What a single request asks for travels in its kv_transfer_params instead
(kv_transfer_params.py).

    harness     HarnessSettings: where the channel meets, where records go, what is checked,
                how long waits last (the run.* and check.* values)
    transport   TransportSettings: the channel under the strategy (conf/transport/)
    strategy    the strategy's own `Params` dataclass, declared on its connector class
                (strategy.params; base.py says how to declare one)

Like kv_transfer_params.py, this module imports neither vLLM nor torch: the harness judges a
configuration (strategy parameters included) before it imports either.
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal


class ContractError(ValueError):
    """A section holds a key its dataclass does not declare, or a value of the wrong type."""


def _from(config_key: str | None) -> dict:
    """A field's metadata: the configuration value the harness fills it from (None: the harness
    derives it from the run itself)."""
    return {"config": config_key}


@dataclass(frozen=True)
class HarnessSettings:
    """What the harness sets for a run's engines. The defaults are conf/config.yaml's (a test
    holds them together); unit tests that build a worker alone rely on them."""

    # a file through which the sender tells the receiver the port it bound; on a decode worker fed
    # by several prefill workers, one file per worker; or tcp://HOST:PORT (transport.address)
    rendezvous: str | list[str] | None = field(default=None, metadata=_from(None))
    host: str = field(default="127.0.0.1", metadata=_from("transport.address"))
    # the records file of requests that name none in their kv_transfer_params (None: no records)
    stats_path: str | None = field(default=None, metadata=_from(None))
    prefill_tp: int = field(default=1, metadata=_from("engines.prefill.tensor_parallel_size"))
    decode_tp: int = field(default=1, metadata=_from("engines.decode.tensor_parallel_size"))
    verify: bool = field(default=True, metadata=_from("check.digests"))  # digests of every transfer's blocks
    checksums: bool = field(default=False, metadata=_from("check.checksums"))  # each message's, checked on arrival
    timeout_s: float = field(default=120.0, metadata=_from("run.transfer_timeout_s"))  # a decode worker's wait for KV
    # opening the channel waits for the other engine to start, up to this long
    startup_timeout_s: float = field(default=600.0, metadata=_from("run.startup_timeout_s"))
    decode_submit: Literal["early", "after_prefill"] = field(default="early", metadata=_from("run.decode_submit"))


# harness values that name the run that started the engines: engines kept for a later run take
# that run's records files from its requests, and their channel is open already
RUN_PATHS = ("rendezvous", "stats_path")


@dataclass(frozen=True)
class TransportSettings:
    """The channel under the strategy (conf/transport/*.yaml holds the same keys)."""

    kind: Literal["staged", "gloo", "nixl"] = "staged"
    staging_mb: int | None = None  # the decode worker's staging buffer (None: 256 MiB on CPU, 4096 on CUDA)
    address: str | None = None  # HOST:PORT the prefill worker listens on (None: a free port on 127.0.0.1)
    ifname: str | None = None  # the interface gloo (GLOO_SOCKET_IFNAME) or UCX (UCX_NET_DEVICES) uses
    # transport=nixl: where NIXL's buffers live (None: host memory where a GPU's KV crosses a link, ifname
    # set; else the KV's own device). transport/__init__.py: nixl_on_host
    buffer_device: Literal["cpu", "cuda"] | None = None


@dataclass(frozen=True)
class NoParams:
    """A strategy without parameters of its own."""


@dataclass(frozen=True)
class ObserverParams:
    """The observer's (observer.py) `strategy` section: the connector it watches."""

    observed: str = ""  # that connector's class name, written in the records' strategy field


@dataclass(frozen=True)
class ConnectorConfig:
    harness: HarnessSettings
    transport: TransportSettings
    strategy: Any  # an instance of the connector's Params

    def to_dict(self) -> dict:
        return {"harness": dataclasses.asdict(self.harness), "transport": dataclasses.asdict(self.transport),
                "strategy": dataclasses.asdict(self.strategy)}

    @classmethod
    def parse(cls, extra: dict | None, params_type: type = NoParams) -> ConnectorConfig:
        """kv_connector_extra_config as the harness wrote it; a missing section takes its defaults."""
        extra = dict(extra or {})
        unknown = set(extra) - {"harness", "transport", "strategy"}
        if unknown:
            raise ContractError(f"kv_connector_extra_config has sections {sorted(unknown)} this project's connectors "
                                f"do not read (harness, transport, strategy)")
        return cls(parse(HarnessSettings, extra.get("harness"), "harness"),
                   parse(TransportSettings, extra.get("transport"), "transport"),
                   parse(params_type, extra.get("strategy"), "strategy.params"))


def parse(section: type, values: dict | None, where: str):
    """An instance of the dataclass `section` from `values`, every key declared and of its type
    (an int passes for a float; None only where the type allows it; a Literal's values only)."""
    values = dict(values or {})
    fields = {f.name: f for f in dataclasses.fields(section)}
    unknown = [k for k in values if k not in fields]
    if unknown:
        takes = ", ".join(fields) or "none"
        raise ContractError(f"{where}.{unknown[0]} is not a parameter here (it takes: {takes})")
    hints = typing.get_type_hints(section)
    out = {}
    for name, value in values.items():
        out[name] = _checked(value, hints[name], f"{where}.{name}")
    return section(**out)


def _checked(value, kind, where: str):
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is Literal:
        if value not in args:
            raise ContractError(f"{where} must be one of {', '.join(map(repr, args))}, got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arm in (a for a in args if a is not type(None)):
            with contextlib.suppress(ContractError):
                return _checked(value, arm, where)
        raise ContractError(f"{where} must be {_type_name(kind)}, got {value!r}")
    if origin is list:
        if not isinstance(value, list | tuple):
            raise ContractError(f"{where} must be a list, got {value!r}")
        return [_checked(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)] if args else list(value)
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ContractError(f"{where} must be a number, got {value!r}")
        return float(value)
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ContractError(f"{where} must be an integer, got {value!r}")
    if kind in (bool, str) and not isinstance(value, kind):
        raise ContractError(f"{where} must be {'true or false' if kind is bool else 'a string'}, got {value!r}")
    return value  # any other type (a dict, Any) is taken as given


def _type_name(kind) -> str:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is Literal:
        return " | ".join(map(repr, args))
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _type_name(a) for a in args)
    if origin is list:
        return f"list of {_type_name(args[0])}" if args else "list"
    return getattr(kind, "__name__", str(kind))
