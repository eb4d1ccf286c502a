"""A hybrid model on CPU with real vLLM engines: the trained tiny-hybrid (models/tiny-hybrid,
Qwen3-Next's layout: three Gated DeltaNet layers, each with a recurrent state per request, and
one full-attention layer). vLLM's hybrid allocator keeps both kinds in shared pools of pages (an
attention block of 160 tokens, or a request's state); the strategies move a request's pages of
every pool (transfer_strategies/kv_groups.py), the prefill engine computing the prompt but its
last token, which the decode engine computes from the state it received. Outputs are the
baseline's, every page's digest agrees, and a damaged state page changes the outputs."""

import json

import pytest

from harness.workload import is_warmup
from tests.conftest import cells, run_harness
from tests.helpers.runs import edge_prompts, harness_on_edge_prompts

pytestmark = pytest.mark.engine

BLOCK = 160  # vLLM's attention block for tiny-hybrid: a page of 160 tokens' K and V holds a state
PAGE = 2 * 2 * BLOCK * 64 * 2  # bytes: K and V, 2 heads of 64, bf16
STATES = 3  # Gated DeltaNet layers: one state page each per request


@pytest.fixture(scope="module", params=cells(["fused", "per_request_blocks", "full_cache"], {"fused"}))
def hybrid_run(request, results_dir, tmp_path_factory):
    run = harness_on_edge_prompts(results_dir, tmp_path_factory, f"hybrid-{request.param}", "model=tiny_hybrid",
                                  f"strategy={request.param}", f"engine.block_size={BLOCK}")
    run.case = request.param
    return run


def test_the_state_and_the_kv_move_and_the_outputs_are_the_baselines(hybrid_run):
    assert hybrid_run.code == 0, hybrid_run.stderr[-3000:]
    s = hybrid_run.summary
    assert s["status"] == "ok" and s["match_rate"] == 1.0 and s["digest_failures"] == 0
    assert s["kv_recomputed"] == 0  # the decode engine computed each prompt's last token only
    prompts = edge_prompts(BLOCK)
    for r in hybrid_run.jsonl("requests.jsonl"):
        n = len(prompts[r["prompt_idx"]]) - 1  # tokens sent: all but the last
        pages = 0 if n == 0 else STATES + -(-n // BLOCK)
        assert r["blocks"] == pages and r["digest_match"] is (True if pages else None)
        if hybrid_run.case != "full_cache":
            assert r["bytes"] == pages * PAGE
    sent = [json.loads(line) for line in (hybrid_run.run_dir / "prefill-transfers.jsonl").read_text().splitlines()]
    assert all(set(rec["digests"]) == {"all"} for rec in sent if rec.get("digests"))  # per page, no heads
    geometry = json.loads((hybrid_run.run_dir / "meta.json").read_text())["kv_geometry"]
    assert (geometry["layers"], geometry["state_layers"], geometry["state_bytes"]) == (1, 3, 3 * 68608)


def test_the_prefill_engine_leaves_the_prompts_last_token_to_the_decode_engine(hybrid_run):
    """A recurrent state cannot be cut back by a token: the prefill engine computes the prompt
    but its last token, the decode engine loads those and computes that one (vLLM's scheduler
    counts both: the compute records)."""
    path = hybrid_run.run_dir / "prefill-transfers.compute.jsonl"
    prefill = sorted(r["computed_tokens"] for r in map(json.loads, path.read_text().splitlines())
                     if not is_warmup(r["transfer_id"]))
    prompts = edge_prompts(BLOCK)
    assert prefill == sorted(max(len(p) - 1, 1) for p in prompts)
    for r in hybrid_run.jsonl("requests.jsonl"):
        n = len(prompts[r["prompt_idx"]])
        assert (r["decode_loaded_tokens"], r["decode_computed_tokens"]) == (n - 1, 1)


@pytest.mark.full
def test_a_damaged_state_page_is_caught_and_changes_the_outputs(results_dir):
    # the negative control damages each request's first page received: the first Gated DeltaNet layer's state
    run = run_harness(results_dir / "hybrid-corrupt", "model=tiny_hybrid", "strategy=fused", "workload=corpus",
                      "workload.num_prompts=4", "workload.prompt_len=200", "sampling.max_tokens=8",
                      "check.corrupt=true")
    assert run.code == 1, run.stderr[-3000:]  # a mismatch
    s = run.summary
    assert s["status"] == "mismatch" and s["digest_failures"] == s["digest_checked"] == 4
    assert s["match_rate"] < 0.5 and s["task_score"] < s["base_task_score"]


@pytest.mark.full
def test_a_decode_request_preempted_after_its_state_arrived_is_recomputed_right(results_dir):
    # the scenario's prompts of 150 tokens (not 96): with 64 tokens out a request's attention outgrows one
    # 160-token page, so the decode engine's 16 pages run out mid-decode
    run = run_harness(results_dir / "hybrid-preempt", "model=tiny_hybrid", "strategy=fused",
                      "scenario=decode_preemption", "workload=corpus", "workload.prompt_len=150")
    assert run.code == 0, run.stderr[-3000:]
    s = run.summary
    assert s["status"] == "ok" and s["match_rate"] == 1.0 and s["digest_failures"] == 0
    assert s["decode_preemptions"] >= 1 and s["kv_recomputed"] == s["kv_recomputed_preempted"]
    assert s["kv_blocks_in_use"] == {"prefill": 0, "decode": 0}
