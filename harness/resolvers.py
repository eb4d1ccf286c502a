"""The `${...}` resolvers conf/ uses, registered wherever a configuration is composed (harness/
__main__.py, the tests, the scripts): `${project_root:}` (results and model paths hang off the
project, never off the current directory) and `${built_in_strategies:}` (the benchmarks'
default list)."""

from __future__ import annotations

from omegaconf import OmegaConf

from harness.records import PROJECT_ROOT

STRATEGY_CONF = PROJECT_ROOT / "conf" / "strategy"


def built_in_strategies() -> list[str]:
    """This project's strategies: each conf/strategy/*.yaml whose connector is one of
    transfer_strategies' modules, by name. Every test matrix, benchmark and experiment that runs
    "every strategy" reads this list, so a new strategy is enrolled in all of them by its YAML."""
    names = []
    for path in sorted(STRATEGY_CONF.glob("*.yaml")):
        node = OmegaConf.load(path)
        node = node.get("strategy", node)  # a `@package _global_` strategy nests under strategy:
        module = node.get("module")
        if isinstance(module, str) and module.startswith("transfer_strategies."):
            names.append(path.stem)
    return names


def register() -> None:
    OmegaConf.register_new_resolver("project_root", lambda: str(PROJECT_ROOT), replace=True)
    OmegaConf.register_new_resolver("built_in_strategies", built_in_strategies, replace=True)
