"""The strategy benchmark's per-strategy overrides (scripts/bench_strategies.py --set)."""

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "bench_strategies", Path(__file__).resolve().parent.parent / "scripts" / "bench_strategies.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

COMMON = ["model=llama3_8b_shape", "engine.kv_cache_gib=16"]


def test_a_strategy_own_value_replaces_the_common_one():
    sets = ["full_cache:engine.kv_cache_gib=2.5"]
    assert bench.overrides_for("full_cache", COMMON, sets) == ["model=llama3_8b_shape", "engine.kv_cache_gib=2.5"]


def test_other_strategies_keep_the_common_overrides():
    assert bench.overrides_for("fused", COMMON, ["full_cache:engine.kv_cache_gib=2.5"]) == COMMON


@pytest.mark.parametrize("bad", ["engine.kv_cache_gib=2.5", "full_cache:engine.kv_cache_gib", ":x=1"])
def test_a_malformed_set_is_refused_with_the_expected_form(bad, capsys):
    with pytest.raises(SystemExit) as e:
        bench.overrides_for("fused", COMMON, [bad])
    assert "STRATEGY:KEY=VALUE" in str(e.value)
