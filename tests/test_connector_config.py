"""The contract between the harness and this project's connectors (transfer_strategies/
connector_config.py), without engines: the harness writes what the connector parses, with one
set of names and defaults; a strategy's parameters are those its class declares."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from harness.checks import ConfigError, check_strategy_params, load_connector, params_type
from harness.engine_config import transfer_config
from harness.resolvers import built_in_strategies
from harness.settings import settle
from tests.conftest import ROOT, compose_config
from transfer_strategies.connector_config import (
    RUN_PATHS,
    ConnectorConfig,
    ContractError,
    HarnessSettings,
    NoParams,
    TransportSettings,
    parse,
)

CONF = ROOT / "conf"


def extra_config(*overrides: str, engine: str = "decode") -> dict:
    kv = transfer_config(settle(compose_config(*overrides), "cpu"), engine, Path("/run/port"),
                         Path("/run/decode.jsonl"))
    return kv["kv_connector_extra_config"]


def test_what_the_harness_writes_the_connector_parses_back_unchanged():
    for overrides in ([], ["strategy=per_request_blocks", "strategy.params.granularity=block", "transport=gloo",
                           "check.checksums=true", "run.transfer_timeout_s=7", "run.decode_submit=after_prefill"]):
        extra = extra_config(*overrides)
        cls = load_connector(compose_config(*overrides).strategy)
        assert ConnectorConfig.parse(extra, params_type(cls)).to_dict() == extra


def test_the_contracts_defaults_are_the_configs():
    """One set of defaults: a worker built without the harness (unit tests) behaves as a default run's."""
    written = extra_config()
    default = dataclasses.asdict(HarnessSettings())
    assert {k: v for k, v in written["harness"].items() if k not in RUN_PATHS} == \
        {k: v for k, v in default.items() if k not in RUN_PATHS}
    assert written["transport"] == dataclasses.asdict(TransportSettings())
    for path in (CONF / "transport").glob("*.yaml"):  # each transport's keys are the contract's
        assert set(OmegaConf.load(path)) <= {f.name for f in dataclasses.fields(TransportSettings)}, path.name


def test_each_built_in_strategys_yaml_lists_its_declared_parameters_with_their_defaults():
    for name in built_in_strategies():
        strategy = compose_config(f"strategy={name}").strategy
        declared = {f.name: f.default for f in dataclasses.fields(params_type(load_connector(strategy)))}
        assert OmegaConf.to_container(strategy.params) == declared, name
        # `lossy` in the YAML (which test matrices it joins) is what the class says: it names a codec
        assert bool(strategy.get("lossy", False)) == (load_connector(strategy).codec is not None), name


def test_the_connector_refuses_a_key_it_does_not_know_and_a_value_of_the_wrong_type():
    with pytest.raises(ContractError, match=r"harness\.timeout is not a parameter here .*timeout_s"):
        ConnectorConfig.parse({"harness": {"timeout": 5}})
    with pytest.raises(ContractError, match="sections"):
        ConnectorConfig.parse({"harnesss": {}})
    with pytest.raises(ContractError, match=r"harness\.verify must be true or false, got 1"):
        parse(HarnessSettings, {"verify": 1}, "harness")
    with pytest.raises(ContractError, match=r"transport\.kind must be one of 'staged', 'gloo', 'nixl', got 'ucx'"):
        parse(TransportSettings, {"kind": "ucx"}, "transport")
    with pytest.raises(ContractError, match=r"transport\.staging_mb must be int or null, got 'big'"):
        parse(TransportSettings, {"staging_mb": "big"}, "transport")
    assert parse(HarnessSettings, {"timeout_s": 5}, "harness").timeout_s == 5.0  # an int passes for a float
    assert parse(TransportSettings, {"staging_mb": None}, "transport").staging_mb is None


@pytest.mark.parametrize("overrides,message", [
    (["strategy=per_request_blocks", "strategy.params.granularity=x"],
     "strategy 'per_request_blocks': strategy.params.granularity must be one of 'layer', 'block', got 'x'"),
    (["+strategy.params.chunks=4"],
     "strategy 'fused': strategy.params.chunks is not a parameter here (it takes: none)"),
    (["strategy=custom", "strategy.module=examples.two_halves", "strategy.connector=TwoHalvesConnector",
      "strategy.params={split:half}"], "strategy.params.split must be int or null, got 'half'"),
])
def test_a_strategy_parameter_is_checked_against_what_its_class_declares(overrides, message):
    """Before any engine starts (checks.checked_inputs calls this; tests/test_bad_input.py shows
    the exit 2 and one line): granularity=x was an engine dying at its first send."""
    strategy = compose_config(*overrides).strategy
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_strategy_params(strategy, load_connector(strategy))


def test_an_outside_strategy_declares_a_parameter_on_its_class_alone():
    """The worked example: examples/two_halves.py's `split` is one dataclass field there; the
    harness checks it and the connector gets it typed."""
    overrides = ["strategy=custom", "strategy.module=examples.two_halves", "strategy.connector=TwoHalvesConnector",
                 "strategy.params={split:1}"]
    strategy = compose_config(*overrides).strategy
    cls = load_connector(strategy)
    check_strategy_params(strategy, cls)
    assert ConnectorConfig.parse(extra_config(*overrides), cls.Params).strategy == cls.Params(split=1)
    assert params_type(load_connector(compose_config("strategy=fused").strategy)) is NoParams
