"""Harness runs that several test modules make, and the checks on what a run wrote: the edge-case
prompts and the harness run on them (what they cover: tests/test_e2e_cpu.py), a scenario's run
passing or its faults caught, each tensor-parallel worker's transfer records, and a configuration
refused as bad input, and what a run left in /dev/shm."""

import json
import os
import random
from pathlib import Path

from harness import process_group
from harness.process_group import SHM
from harness.workload import is_warmup
from tests.conftest import run_harness, write_token_prompts
from transfer_strategies.records import rank_path

BLOCK = 32


def edge_prompts(block: int = BLOCK) -> list[list[int]]:
    rng = random.Random(1)
    tok = lambda n: [rng.randrange(10, 3400) for _ in range(n)]  # noqa: E731
    prefix = tok(2 * block)
    prompts = [tok(1), tok(5), prefix + tok(9), tok(block), tok(block + 1), tok(block - 1), tok(150),
               tok(2 * block + 1), prefix + tok(7)]
    one_block = prompts[EXTENDED[0]]
    return prompts + [one_block + tok(block), one_block + tok(block + 1)]


SHARED_PREFIX = (2, 8)  # indices of the two prompts that share a prefix
# a one-block prompt, then two that extend it (exactly two blocks, and one token more), late
# enough that it has finished: the decode engine takes its block from its own prefix cache
EXTENDED = (3, 9, 10)


def harness_on_edge_prompts(results_dir, tmp_path_factory, name: str, *overrides: str, env: dict | None = None,
                            device: str = "cpu"):
    # an MLA model's CPU blocks are of 16 tokens (conf/model/tiny_mla.yaml)
    block = next((int(o.split("=")[1]) for o in overrides if o.startswith("engine.block_size=")),
                 16 if "model=tiny_mla" in overrides else BLOCK)
    prompts = write_token_prompts(tmp_path_factory.mktemp(name) / "prompts.jsonl", edge_prompts(block))
    return run_harness(results_dir / f"e2e-{name}", "workload=jsonl", f"workload.path={prompts}",
                       "workload.concurrency=3", "sampling.max_tokens=8", *overrides,
                       env=env, device=device)


def check_passed(run, requests: int = 4) -> dict:
    assert run.code == 0, run.stderr[-3000:]
    s = run.summary
    assert s["status"] == "ok" and s["match_rate"] == 1.0 and s["requests"] == requests
    assert s["digest_failures"] == 0 and s["digest_checked"] == requests
    assert s["kv_blocks_in_use"] == {"prefill": 0, "decode": 0}
    assert s["kv_recomputed"] == s["kv_recomputed_preempted"]
    return s


# what each fault scenario's faulted requests must show: vLLM's policy, the reason in the row
FAULTS = {"drop": ("fail", "no KV arrived"), "delay": ("recompute", "no KV arrived"),
          "truncate": ("fail", "truncated"), "flip": ("recompute", "checksum differs")}


def check_faults_caught(run, kind: str, requests: int = 4, lossy: bool = False) -> None:
    """lossy: a lossy strategy's clean requests need not give the baseline's outputs."""
    assert run.code == 0, run.stderr[-3000:]
    s = run.summary
    assert s["status"] == "ok" and s["requests"] == requests
    # every 2nd prompt's transfer (prompts 1, 3, ...), the warm-up's none
    assert s["faults_injected"] == s["faults_caught"] == requests // 2 and s["faults_missed"] == 0
    assert sorted(r["prompt_idx"] for r in run.jsonl("requests.jsonl") if r["fault"]) == list(range(1, requests, 2))
    assert s["kv_blocks_in_use"] == {"prefill": 0, "decode": 0}
    policy, reason = FAULTS[kind]
    for r in run.jsonl("requests.jsonl"):
        if r["fault"] is None:
            assert (r["match"] or lossy) and r["digest_match"] and r["error"] is None and not r["kv_recomputed"]
        elif policy == "fail":  # vLLM failed the request, the row says why
            assert reason in r["error"] and not r["match"]  # cut short
        else:  # vLLM recomputed it: the right output, and the row says so
            assert reason in r["error"] and r["kv_recomputed"] and r["match"]


def worker_records(run, side: str, tp: int) -> list[list[dict]]:
    """Each worker's transfer records (warm-up excluded), by rank."""
    name = "prefill-transfers.jsonl" if side == "send" else "decode-transfers.jsonl"
    return [[r for r in map(json.loads, rank_path(run.run_dir / name, rank).read_text().splitlines())
             if not is_warmup(r["transfer_id"])] for rank in range(tp)]


def no_engine_started(run):
    return not list(run.run_dir.glob("*.log")) or all(p.name == "__main__.log" for p in run.run_dir.glob("*.log"))


def assert_bad_input(run, *words):
    """Exit 2, exactly one line on stderr (no traceback) holding each of `words`, nothing started."""
    assert run.code == 2, run.stderr[-3000:]
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), run.stderr[-3000:]
    for w in words:
        assert w in lines[0]
    assert run.summary["status"] == "bad_input" and no_engine_started(run)


def shm_now() -> set[str]:
    return set(os.listdir(SHM))


def left_in_shm(before: set[str]) -> set[str]:
    """/dev/shm files that appeared since `before` and that no live process maps: what the run's
    stopped engines left, not the segments of anything still running beside the tests (another
    test session's engines create and remove theirs meanwhile)."""
    return {Path(f).name for f in process_group.unmapped({SHM + n for n in shm_now() - before})}
