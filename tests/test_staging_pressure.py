"""The staging buffer under pressure, with real engines: full_cache moves the whole 64 MiB KV
cache per request, so four requests in one prefill step post more than the 256 MiB CPU staging
buffer holds before the decode engine can use any of it (it gets the requests only after that
step returns). This used to wait out the transfer timeout and fail; the receiver now moves
unused payloads out of the buffer to make room."""

import pytest

from tests.conftest import run_harness

pytestmark = pytest.mark.engine

PROMPTS = 8


def test_full_cache_at_concurrency_4_moves_every_request_intact(results_dir):
    run = run_harness(results_dir / "staging-pressure-full_cache", "strategy=full_cache", "workload=synthetic",
                      "workload.prompt_len=100", f"workload.num_prompts={PROMPTS}", "workload.concurrency=4",
                      "sampling.max_tokens=4")
    assert run.code == 0, run.stderr[-3000:]
    s = run.summary
    assert s["status"] == "ok" and s["requests"] == PROMPTS
    assert s["match_rate"] == 1.0 and s["mismatches"] == 0 and s["digest_failures"] == 0
    rows = run.jsonl("requests.jsonl")
    assert [r["digest_match"] for r in rows] == [True] * PROMPTS
    assert 4 * min(r["bytes"] for r in rows) > 256 * 2**20  # four requests' KV does not fit the buffer
