"""workload=multiturn end to end on CPU (one harness run, three engines): two conversations of
three turns through fused, each turn the previous prompt + the baseline's answer + new user
text, sent once the previous turn has finished, so the decode engine finds the earlier turns in
its own prefix cache."""

import pytest

from tests.conftest import run_harness

pytestmark = pytest.mark.engine

BLOCK, ANSWER = 32, 8


@pytest.fixture(scope="module")
def conversation_run(results_dir):
    return run_harness(results_dir / "e2e-multiturn", "strategy=fused", "workload=multiturn",
                       "workload.num_conversations=2", "workload.turns=3", f"sampling.max_tokens={ANSWER}")


def test_every_turn_matches_the_baseline_with_its_kv_intact(conversation_run):
    run = conversation_run
    assert run.code == 0, run.stderr[-3000:]
    s = run.summary
    assert s["status"] == "ok" and s["requests"] == 6 and s["match_rate"] == 1.0
    assert s["digest_checked"] == 6 and s["digest_failures"] == 0 and s["kv_recomputed"] == 0
    assert len(run.jsonl("baseline_repeat.jsonl")) == 6  # the baseline's second pass sent the same prompts


def test_turns_run_in_order_each_continuing_the_previous_answer(conversation_run):
    rows = conversation_run.jsonl("requests.jsonl")  # appended as each finishes
    base = {r["prompt_idx"]: r for r in conversation_run.jsonl("baseline.jsonl")}
    for c in (0, 1):
        turns = [r for r in rows if r["conversation"] == c]
        assert [r["turn"] for r in turns] == [0, 1, 2]
        # turn 2 (counted from 1) ends on a block boundary, turns 1 and 3 inside a block
        assert [r["prompt_len"] % BLOCK == 0 for r in turns] == [False, True, False]
        for prev, r in zip(turns, turns[1:]):
            assert r["prompt_len"] > prev["prompt_len"] + ANSWER
            assert base[r["prompt_idx"]]["prompt_len"] == r["prompt_len"]


def test_the_decode_engine_had_the_earlier_turns_in_its_prefix_cache(conversation_run):
    """Turn t + 1 finds turn t's prompt and answer (less the answer's last token, never computed)
    in the decode engine's blocks, up to what vLLM matches (the prompt less its last token)."""
    run = conversation_run
    rows = {(r["conversation"], r["turn"]): r for r in run.jsonl("requests.jsonl")}
    for (c, t), r in rows.items():
        prev = rows.get((c, t - 1))
        expected = min((prev["prompt_len"] + ANSWER - 1) // BLOCK, (r["prompt_len"] - 1) // BLOCK) if prev else 0
        assert r["skip_blocks"] == expected >= (1 if prev else 0), (c, t)
    s = run.summary
    assert s["decode_prefix_hit_blocks"] == sum(r["skip_blocks"] for r in rows.values()) > 0
    # fused sends every block, those the decode engine had included
    assert s["bytes_for_cached_blocks"] == sum(r["bytes"] * r["skip_blocks"] // r["blocks"] for r in rows.values())
    assert 0 < s["bytes_for_cached_blocks"] < s["total_bytes"]
    assert "decode prefix-cache hits" in run.stdout
