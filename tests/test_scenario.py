"""harness/scenario.py without engines: a scenario's values are checked before anything starts,
and what it provokes is seeded and the same for both runners (tests/test_scenarios_cpu.py runs
each scenario on engines)."""

import random
import time

import pytest
from omegaconf import OmegaConf

from harness import scenario
from harness.checks import ConfigError, check_settings
from harness.offline import pipeline as pipeline_module
from harness.records import provoked
from harness.workload import Prompt, Workload
from tests.conftest import ROOT, compose_config


def workload(n: int = 16) -> Workload:
    return Workload("w", [Prompt(i, [1, 2, 3]) for i in range(n)], concurrency=4)


def test_the_abort_plan_is_the_one_the_committed_runs_were_given():
    """The default sides draw as the plan did before scenarios had a module of their own."""
    cfg = compose_config("scenario=aborts")
    plan = scenario.abort_plan(workload(), cfg)
    rng = random.Random(cfg.engine.seed)
    chosen = rng.sample(list(workload().prompts), 8)
    before = {p.index: (rng.uniform(0, 0.06), rng.choice([("prefill",), ("decode",), ("prefill", "decode")]))
              for p in chosen}
    assert {i: (a.after_s, a.engines) for i, a in plan.items()} == before


def test_a_scenario_can_abort_the_decode_requests_alone():
    """The worked example of a new scenario: conf/scenario/aborts_parked.yaml and aborts.sides."""
    plan = scenario.abort_plan(workload(), compose_config("scenario=aborts_parked"))
    assert len(plan) == 8 and {a.engines for a in plan.values()} == {("decode",)}
    assert all(0 <= a.after_s <= 0.04 for a in plan.values())
    assert scenario.abort_plan(workload(), compose_config()) == {}


def test_client_aborts_are_seeded_by_the_serving_seed():
    cfg = compose_config("runner=serve", "scenario=aborts")
    first, again = scenario.client_aborts(cfg, 20), scenario.client_aborts(cfg, 20)
    assert first == again and sum(a is not None for a in first) == 10
    assert all(0 <= a <= 0.06 for a in first if a is not None)
    assert scenario.client_aborts(compose_config("runner=serve"), 5) == [None] * 5


def test_faults_fall_on_every_nth_measured_prompt():
    cfg = compose_config("scenario=fault_delay")
    hit = [p.index for p in workload(8).prompts if scenario.fault_for(cfg, p)]
    assert hit == [1, 3, 5, 7] and scenario.fault_for(cfg, Prompt(-1, [1])) is None  # the warm-up: none
    assert scenario.fault_for(cfg, Prompt(1, [1])) == {"kind": "delay", "delay_s": 7.0}


@pytest.mark.parametrize("overrides,message", [
    (["scenario=aborts", "scenario.aborts.sides=[decoder]"], "scenario.aborts.sides must name some of"),
    (["scenario=aborts", "scenario.aborts.max_delay_ms=0"], "scenario.aborts needs a fraction in (0, 1]"),
    (["scenario=fault_drop", "scenario.fault.every=0"], "scenario.fault.every must be an integer >= 1"),
])
def test_a_scenarios_values_are_checked_before_anything_starts(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        check_settings(compose_config(*overrides))


def test_provoked_rows_and_their_counts():
    rows = [{"fault": "drop", "error": "no KV arrived"}, {"fault": "flip", "kv_recomputed": True, "match": True},
            {"fault": "flip", "error": None, "match": False}, {"aborted": "decode"}, {"fault": None, "aborted": ""}]
    assert [provoked.provoked(r) for r in rows] == [True, True, True, True, False]
    assert provoked.fault_counts(rows) == {"faults_injected": 3, "faults_caught": 2, "faults_missed": 1}
    assert provoked.aborted(rows) == 1 and provoked.provoked({"fault": float("nan")}) is False
    assert OmegaConf.to_container(compose_config("scenario=aborts_parked").scenario.aborts)["sides"] == ["decode"]


def test_every_scenario_says_what_it_provokes_and_what_its_run_must_show():
    """Each conf/scenario/*.yaml: provokes, shows, and expect (what summary.json must show: the
    verdict judges it); docs/configuration.md's table of them is written from the YAMLs
    (python scripts/doc_tables.py)."""
    import importlib.util

    from harness.records.verdict import condition

    for path in sorted((ROOT / "conf" / "scenario").glob("*.yaml")):
        s = OmegaConf.load(path).scenario
        assert s.name == path.stem and s.provokes and s.shows and "expect" in s, path.name
        assert all(condition(v) for v in (s.expect or {}).values())
    spec = importlib.util.spec_from_file_location("doc_tables", ROOT / "scripts" / "doc_tables.py")
    doc_tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(doc_tables)
    text = (ROOT / "docs" / "configuration.md").read_text()
    assert doc_tables.scenario_table() in text, "python scripts/doc_tables.py"
    assert all(f"| `{p.stem}` |" in text for p in (ROOT / "conf" / "scenario").glob("*.yaml"))


class StandInEngine:
    """An engine for the offline pipeline that answers a request `takes_s` after it came (never:
    None) and an abort at once, as harness/engine_process.py reports them."""

    def __init__(self, name: str, takes_s: float | None):
        self.name, self.takes_s = name, takes_s
        self.due: dict[str, float] = {}  # live request id -> when it finishes on its own
        self.events: list[dict] = []
        self.submitted_at: dict[str, float] = {}
        self.aborted_at: dict[str, float] = {}

    def submit(self, req_id, token_ids, sampling):
        self.submitted_at[req_id] = time.monotonic()
        self.due[req_id] = time.monotonic() + self.takes_s if self.takes_s is not None else float("inf")

    def abort(self, req_id):
        if self.due.pop(req_id, None) is not None:
            now = self.aborted_at[req_id] = time.monotonic()
            self.events.append({"req_id": req_id, "token_ids": [], "logprobs": None, "first_token_t": now,
                                "finished_t": now, "finish_reason": "abort"})

    def next_events(self, wait_s: float) -> list[dict]:
        now = time.monotonic()
        for rid in [r for r, t in self.due.items() if t <= now]:
            del self.due[rid]
            self.events.append({"req_id": rid, "token_ids": [7], "logprobs": None, "first_token_t": now,
                                "finished_t": now, "finish_reason": "length"})
        out, self.events = self.events, []
        return out


def relay_pipeline(monkeypatch, prefill_s, decode_s, abort: scenario.Abort):
    """One prompt through a prefill engine, then a decode engine (the relay of vLLM's connectors:
    the decode request goes once the prefill answered), with one abort planned."""
    engines = [StandInEngine("prefill", prefill_s), StandInEngine("decode", decode_s)]

    def next_events(engs, wait_s):
        time.sleep(min(wait_s, 0.005))
        return [(e, "done", info) for e in engs for info in e.next_events(wait_s)]
    monkeypatch.setattr(pipeline_module, "next_events", next_events)
    finished = []
    stages = [[(engines[0], lambda p, r: {})], [(engines[1], lambda p, r: {})]]
    pipeline_module.pipeline(stages, Workload("w", [Prompt(0, [1, 2, 3])]), 3.0,
                             lambda p, t0, results: finished.append(results), aborts={0: abort})
    return engines, finished[0]


def test_a_decode_side_abort_is_timed_from_the_decode_requests_own_submission(monkeypatch):
    """Sent only once the prefill answered (50 ms here), the decode request is still abandoned
    10 ms into its own life: timed from the prompt's first submission, the abort would have found
    no decode request yet, and this decode request, which never ends by itself, would hang."""
    (prefill, decode), (pre, dec) = relay_pipeline(monkeypatch, 0.05, None, scenario.Abort(0.01, ("decode",)))
    assert pre["finish_reason"] == "length" and dec["finish_reason"] == "abort"
    assert decode.aborted_at["0"] - decode.submitted_at["0"] >= 0.01


def test_a_prompt_whose_prefill_was_aborted_sends_no_decode_request(monkeypatch):
    """As a router would not: the decode request would carry the prefill's answer (vLLM's
    connectors), which an aborted prefill never gives."""
    (prefill, decode), (pre, dec) = relay_pipeline(monkeypatch, None, 0.01, scenario.Abort(0.01, ("prefill", "decode")))
    assert pre["finish_reason"] == "abort" and dec["finish_reason"] == "not_sent"
    assert not decode.submitted_at
