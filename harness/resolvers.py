"""The `${...}` resolvers conf/ uses, registered wherever a configuration is composed (harness/
__main__.py, the tests, the scripts): `${project_root:}` (results and model paths hang off the
project, never off the current directory) and `${built_in_strategies:}` (the benchmarks'
default list)."""

from __future__ import annotations

from omegaconf import OmegaConf

from harness import PROJECT_ROOT

STRATEGY_CONF = PROJECT_ROOT / "conf" / "strategy"


def built_in_strategies(lossy: bool | None = None) -> list[str]:
    """This project's strategies: each conf/strategy/*.yaml whose connector is one of
    transfer_strategies' modules, by name. Every test matrix, benchmark and experiment that runs
    "every strategy" reads this list, so a new strategy is enrolled in all of them by its YAML.
    lossy: only those whose YAML says `lossy: true` (a codec's compressed KV: outputs may differ
    from the baseline's), or only the others (the matrices that require equal outputs)."""
    names = []
    for path in sorted(STRATEGY_CONF.glob("*.yaml")):
        node = OmegaConf.load(path)
        node = node.get("strategy", node)  # a `@package _global_` strategy nests under strategy:
        module = node.get("module")
        ours = isinstance(module, str) and module.startswith("transfer_strategies.")
        if ours and (lossy is None or bool(node.get("lossy", False)) == lossy):
            names.append(path.stem)
    return names


def register() -> None:
    OmegaConf.register_new_resolver("project_root", lambda: str(PROJECT_ROOT), replace=True)
    OmegaConf.register_new_resolver("built_in_strategies", built_in_strategies, replace=True)
