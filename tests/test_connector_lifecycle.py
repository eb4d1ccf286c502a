"""The connector's scheduler side inside vLLM's real v1 scheduler, no engine started: requests go
through `vllm.v1.core.sched.scheduler.Scheduler` with this project's FusedConnector configured as
the harness configures it (harness/engine_config.transfer_config), and only the model runner is
faked: each step's `ModelRunnerOutput` samples a token for the requests that reached the end of
their known tokens and carries what a worker reports (`KVConnectorOutput`: finished_recving,
invalid_block_ids), the way vLLM's own connector unit tests drive the scheduler.

What is proven, on the decode side unless said otherwise: an early-submitted request is parked
(WAITING_FOR_REMOTE_KVS, its blocks held and listed once in `parked`) until the worker releases it,
then runs to the end; one aborted while parked is `cancelled` for the worker and its blocks come
back once the worker lets go; a failed load ends it in an error (kv_load_failure_policy "fail") or
has it compute its prompt again ("recompute"); one preempted after its KV came loads nothing on
re-admission; a prompt already in this engine's prefix cache is drained, not parked; the prefill
side sends once, in the step that computes the prompt's last token, chunked or not. Every case
ends with no KV block held by vLLM and nothing left in the connector's per-request tables, also
for a request vLLM asked about but could not allocate before it was aborted (it leaked an entry).

Not marked slow: its tests take 2-4 s together on a loaded 2-core machine; the rest of the
module's 17-40 s run alone is importing vLLM and torch, which every test module that imports
transfer_strategies pays once per session (test_scheduler_side.py takes as long to collect).
"""

from __future__ import annotations

import functools
import json
import threading
from pathlib import Path

import pytest
import torch
from vllm import SamplingParams
from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import FinishReason, Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from harness.engine_config import transfer_config
from harness.settings import settle
from tests.conftest import ROOT, compose_config
from transfer_strategies.fused import FusedConnector
from transfer_strategies.kv_transfer_params import push_params
from transfer_strategies.scheduler import RequestTracker

MODEL = ROOT / "models" / "tiny-llama"  # its config is read, not its weights: nothing is downloaded
BLOCK = 4
EOS = 2  # the model's eos_token_id
TOKEN = 7  # what the fake runner samples: never EOS, so a request runs to its max_tokens

# Helpers below follow vLLM's tests/v1/kv_connector/unit/utils.py (create_vllm_config,
# create_scheduler, create_request, create_model_runner_output), cut down to this project's
# connector and the installed vLLM's signatures.


@functools.cache
def harness_config(policy: str | None):
    """The run's configuration (Hydra's compose: most of a scheduler's making, so once per policy;
    transfer_config only reads it)."""
    return settle(compose_config("strategy=fused", *([f"run.kv_load_failure_policy={policy}"] if policy else [])),
                  "cpu")


def make_scheduler(tmp_path: Path, engine: str = "decode", num_blocks: int = 64, policy: str | None = None,
                   max_num_batched_tokens: int = 64, long_prefill_token_threshold: int = 0) -> Scheduler:
    """vLLM's scheduler with the connector configured as the harness configures the engine
    (`engine`: prefill or decode); its scheduler-side records go under tmp_path."""
    kv = transfer_config(harness_config(policy), engine, tmp_path / "rendezvous",
                         tmp_path / f"{engine}-transfers.jsonl")
    model = ModelConfig(model=str(MODEL), tokenizer=str(MODEL), skip_tokenizer_init=True, dtype="float32", seed=0,
                        max_model_len=256)
    vllm_config = VllmConfig(
        model_config=model,
        scheduler_config=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=max_num_batched_tokens,
                                         max_model_len=256, enable_chunked_prefill=True,
                                         long_prefill_token_threshold=long_prefill_token_threshold,
                                         is_encoder_decoder=False),
        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=True),
        kv_transfer_config=KVTransferConfig(**kv),
        device_config=DeviceConfig("cpu"),
    )
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    # the scheduler only counts blocks: one layer of one head of size 1 stands for the model's
    kv_cache = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1,
                                                      dtype=torch.float32))])
    init_none_hash(sha256)  # the engine core does this before any request is hashed
    return Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache,
                     structured_output_manager=StructuredOutputManager(vllm_config), block_size=BLOCK)


def make_request(rid: str, prompt_len: int, first_token: int, params: dict | None = None,
                 max_tokens: int = 3) -> Request:
    """A request as the engine builds it from the harness's: kv_transfer_params in extra_args."""
    sampling = SamplingParams(max_tokens=max_tokens, extra_args={"kv_transfer_params": params} if params else None)
    sampling.update_from_generation_config({}, EOS)
    return Request(request_id=rid, prompt_token_ids=list(range(first_token, first_token + prompt_len)),
                   sampling_params=sampling, pooling_params=None,
                   block_hasher=get_request_block_hasher(BLOCK, sha256))


def runner_output(scheduler: Scheduler, out, finished_recving: set[str] | None = None,
                  invalid_block_ids: set[int] | None = None) -> ModelRunnerOutput:
    """What the model runner would return for `out`: a token for each request whose step reached
    its last known token (a partial prefill chunk samples nothing), and the worker's report."""
    req_ids = list(out.num_scheduled_tokens)
    sampled = [[TOKEN] if scheduler.requests[r].num_computed_tokens >= scheduler.requests[r].num_tokens else []
               for r in req_ids]
    report = None
    if finished_recving or invalid_block_ids:
        report = KVConnectorOutput(finished_recving=finished_recving, invalid_block_ids=invalid_block_ids or set())
    return ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                             sampled_token_ids=sampled, kv_connector_output=report)


def step(scheduler: Scheduler, finished_recving: set[str] | None = None, invalid_block_ids: set[int] | None = None):
    """One engine step: schedule, then the (fake) runner's output. Returns the scheduler output,
    the connector's metadata for that step, and the engine outputs by request id."""
    out = scheduler.schedule()
    outputs = scheduler.update_from_output(out, runner_output(scheduler, out, finished_recving, invalid_block_ids))
    by_request = {o.request_id: o for client in outputs.values() for o in client.outputs}
    return out, out.kv_connector_metadata, by_request


def free_blocks(scheduler: Scheduler) -> int:
    return scheduler.kv_cache_manager.block_pool.get_num_free_blocks()


def usable_blocks(scheduler: Scheduler) -> int:
    return scheduler.kv_cache_manager.block_pool.num_gpu_blocks - 1  # block 0 is vLLM's null block


def assert_nothing_held(scheduler: Scheduler) -> None:
    """No request left in vLLM, every block back in the pool (prefix-cached ones count as free),
    and the connector's per-request tables empty (a leak there grows with every request served)."""
    assert scheduler.requests == {} and not scheduler.running and not scheduler.finished_recving_kv_req_ids
    assert free_blocks(scheduler) == usable_blocks(scheduler)
    assert all(b.ref_cnt == 0 for b in scheduler.kv_cache_manager.block_pool.blocks[1:])
    tracker = scheduler.connector.scheduler
    assert (tracker._computed, tracker._sends, tracker._local_hits, tracker._parked, tracker._expired) == \
        ({}, {}, {}, {}, set())


def record_matches(scheduler: Scheduler) -> list[tuple[str, int, tuple]]:
    """What the connector answers each time vLLM asks how many tokens it brings (a spy: the real
    method answers), as (req_id, num_computed_tokens, answer)."""
    asked, ask = [], scheduler.connector.get_num_new_matched_tokens

    def spy(request, num_computed_tokens):
        answer = ask(request, num_computed_tokens)
        asked.append((request.request_id, num_computed_tokens, answer))
        return answer

    scheduler.connector.get_num_new_matched_tokens = spy
    return asked


def compute_records(tmp_path: Path, engine: str = "decode") -> list[dict]:
    path = tmp_path / f"{engine}-transfers.compute.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def park(scheduler: Scheduler) -> Request:
    """An early decode request "d", admitted and parked: 16 prompt tokens to load into blocks 1-4."""
    req = make_request("d", 17, 100, push_params("t-d", early=True))
    scheduler.add_request(req)
    step(scheduler)
    assert req.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    return req


# ---------------------------------------------------------------- the scheduler role


def test_the_scheduler_role_builds_only_a_request_tracker(tmp_path):
    """vLLM builds a connector in its scheduler process too: that one must open no channel (the
    rendezvous would wait for the other engine) and start no thread."""
    threads = threading.active_count()
    for engine in ("prefill", "decode"):
        connector = make_scheduler(tmp_path, engine).connector
        assert isinstance(connector, FusedConnector) and isinstance(connector.scheduler, RequestTracker)
        assert connector.worker is None and connector.scheduler.is_producer == (engine == "prefill")
    assert threading.active_count() == threads
    assert list(tmp_path.iterdir()) == []  # no rendezvous file, no records before a request ends


# ---------------------------------------------------------------- decode: early submission


def test_an_early_request_is_parked_with_its_blocks_until_released_then_runs_to_the_end(tmp_path):
    s = make_scheduler(tmp_path)
    d = make_request("d", 17, 100, push_params("t-d", early=True), max_tokens=3)
    s.add_request(d)
    out, meta, _ = step(s)
    assert d.status == RequestStatus.WAITING_FOR_REMOTE_KVS and out.num_scheduled_tokens == {}
    assert s.kv_cache_manager.get_block_ids("d") == ([1, 2, 3, 4],)  # tokens [0, 16): what the prefill sends
    (p,) = meta.parked
    assert (p.req_id, p.transfer_id, p.block_ids, p.skip_blocks, p.num_tokens) == ("d", "t-d", [1, 2, 3, 4], 0, 16)
    assert meta.loads == meta.drains == [] and meta.scheduled == {} and meta.idle
    assert free_blocks(s) == usable_blocks(s) - 4

    # no KV yet: it stays parked, and is not handed to the worker a second time
    _, meta, _ = step(s)
    assert d.status == RequestStatus.WAITING_FOR_REMOTE_KVS and meta.parked == [] and meta.idle
    # the worker loaded it and reports it: vLLM schedules its last prompt token in the next step
    step(s, finished_recving={"d"})
    out, meta, _ = step(s)
    assert [(n.req_id, n.num_computed_tokens) for n in out.scheduled_new_reqs] == [("d", 16)]
    assert out.num_scheduled_tokens == {"d": 1} and set(meta.scheduled) == {"d"}
    assert meta.parked == meta.loads == meta.drains == [] and not meta.idle
    for _ in range(2):
        _, meta, outputs = step(s)
    assert d.status == RequestStatus.FINISHED_LENGTH_CAPPED and list(d.output_token_ids) == [TOKEN] * 3
    assert outputs["d"].finish_reason == FinishReason.LENGTH
    _, meta, _ = step(s)
    assert meta.cancelled == []  # no longer parked when it finished: nothing for the worker to drop
    assert_nothing_held(s)
    (rec,) = compute_records(tmp_path)
    assert (rec["transfer_id"], rec["loaded_tokens"], rec["computed_tokens"], rec["admissions"]) == ("t-d", 16, 1, 1)


def test_a_request_aborted_while_parked_is_cancelled_and_freed_once_the_worker_lets_go(tmp_path):
    s = make_scheduler(tmp_path)
    park(s)
    s.finish_requests("d", RequestStatus.FINISHED_ABORTED)
    # vLLM keeps the blocks: the worker may be writing into them until it reports the request
    assert "d" in s.requests and free_blocks(s) == usable_blocks(s) - 4
    _, meta, _ = step(s)
    assert meta.cancelled == ["d"] and meta.parked == []
    _, meta, _ = step(s)
    assert meta.cancelled == []  # told once
    assert free_blocks(s) == usable_blocks(s) - 4
    step(s, finished_recving={"d"})  # the worker dropped it (parking.cancel released it)
    assert_nothing_held(s)


def fail_load(scheduler: Scheduler, early: bool) -> tuple[Request, dict]:
    """A decode request whose load fails as the worker reports it: a parked request whose KV never
    came is released and its blocks failed in one step (parking.py); a hand-off's load caught
    broken fails its blocks in the step that loads it (ReceiveSide.fail_receive). Returns the
    request and that step's engine outputs."""
    if early:
        d = park(scheduler)
        _, _, outputs = step(scheduler, finished_recving={"d"}, invalid_block_ids={1, 2, 3, 4})
        return d, outputs
    d = make_request("d", 17, 100, push_params("t-d"))
    scheduler.add_request(d)
    _, meta, outputs = step(scheduler, invalid_block_ids={1, 2, 3, 4})
    assert [(r.req_id, r.block_ids) for r in meta.loads] == [("d", [1, 2, 3, 4])]
    return d, outputs


@pytest.mark.parametrize("early", [True, False], ids=["early", "handoff"])
def test_a_failed_load_under_the_fail_policy_ends_the_request_with_an_error(tmp_path, early):
    s = make_scheduler(tmp_path, policy="fail")
    assert s.vllm_config.kv_transfer_config.kv_load_failure_policy == "fail"
    d, outputs = fail_load(s, early)
    assert d.status == RequestStatus.FINISHED_ERROR and "d" not in s.requests
    assert outputs["d"].finish_reason == FinishReason.ERROR and outputs["d"].new_token_ids == []
    _, meta, _ = step(s)
    # finished while parked: cancelled (harmless for a worker that already released it)
    assert meta.cancelled == (["d"] if early else [])
    assert_nothing_held(s)
    (rec,) = compute_records(tmp_path)
    assert rec["computed_tokens"] == (0 if early else 1)  # a hand-off's step computed its last prompt token


@pytest.mark.parametrize("early", [True, False], ids=["early", "handoff"])
def test_a_failed_load_under_the_recompute_policy_computes_the_prompt_again_and_loads_nothing(tmp_path, early):
    s = make_scheduler(tmp_path, policy="recompute")
    d, _ = fail_load(s, early)
    assert d.num_computed_tokens == 0  # truncated at the first failed block
    assert d.status == (RequestStatus.WAITING_FOR_REMOTE_KVS if early else RequestStatus.RUNNING)
    out, meta, _ = step(s)
    if early:  # admitted again (its blocks were freed): a new request to the model runner
        assert [(n.req_id, n.num_computed_tokens) for n in out.scheduled_new_reqs] == [("d", 0)]
    else:  # kept its blocks and its place among the running requests
        assert out.scheduled_cached_reqs.req_ids == ["d"] and out.scheduled_cached_reqs.num_computed_tokens == [0]
    assert out.num_scheduled_tokens == {"d": 17}  # the whole prompt, nothing taken from the connector
    assert meta.parked == meta.loads == meta.drains == meta.cancelled == []
    for _ in range(2):
        _, meta, _ = step(s)
        assert meta.parked == meta.loads == meta.drains == []
    assert d.status == RequestStatus.FINISHED_LENGTH_CAPPED and list(d.output_token_ids) == [TOKEN] * 3
    assert_nothing_held(s)
    (rec,) = compute_records(tmp_path)
    # a hand-off's first step computed its last prompt token before the whole prompt again
    assert (rec["computed_tokens"], rec["admissions"]) == (17 if early else 18, 1)


# ---------------------------------------------------------------- decode: preemption


@pytest.mark.parametrize("early", [True, False], ids=["early", "handoff"])
@pytest.mark.parametrize(("other_tokens", "found"), [(8, 8), (16, 0)], ids=["kv-kept", "kv-evicted"])
def test_a_request_preempted_after_its_kv_came_loads_nothing_when_admitted_again(tmp_path, early, other_tokens,
                                                                                 found):
    """Its message was taken at the first admission: waiting for another would time out. A pool
    of 5 usable blocks makes vLLM preempt it, the request admitted last, when `other` grows; vLLM
    finds what its prefix cache still holds of the loaded blocks (`found` tokens: all of them, or
    none once `other` grew into them) and computes the rest."""
    s = make_scheduler(tmp_path, num_blocks=6)
    matched = record_matches(s)
    other = make_request("other", 4, 1000, max_tokens=other_tokens)  # no transfer id: the connector leaves it
    s.add_request(other)
    step(s)
    d = make_request("d", 9, 100, push_params("t-d", early=early), max_tokens=8)
    s.add_request(d)
    metas, readmitted, reported = [], None, not early
    for _ in range(60):
        # the worker reports a parked request once, in the step after it was parked
        release = not reported and d.status == RequestStatus.WAITING_FOR_REMOTE_KVS
        reported |= release
        out, meta, _ = step(s, finished_recving={"d"} if release else None)
        metas.append(meta)
        cached = out.scheduled_cached_reqs
        if "d" in cached.resumed_req_ids:
            readmitted = cached.num_computed_tokens[cached.req_ids.index("d")]
        if not s.requests:
            break
    assert d.num_preemptions == 1, "the pool was not small enough to preempt d"
    assert d.status == other.status == RequestStatus.FINISHED_LENGTH_CAPPED
    first, *again = [(computed, answer) for rid, computed, answer in matched if rid == "d"]
    assert first == (0, (8, early))  # tokens [0, 8) from the connector
    assert again and all(answer == (0, False) for _, answer in again)
    assert readmitted == again[-1][0] == found
    moved = [(name, r.block_ids) for m in metas for name in ("loads", "parked", "drains")
             for r in getattr(m, name) if r.req_id == "d"]
    assert moved == [("parked" if early else "loads", [3, 4])]  # its first admission only (other holds 1, 2)
    assert_nothing_held(s)
    (rec,) = [r for r in compute_records(tmp_path) if r["req_id"] == "d"]
    assert (rec["admissions"], rec["loaded_tokens"]) == (2, 8)
    assert rec["computed_tokens"] == 1 + (9 - found)  # its last prompt token, then what the cache lacked


def test_a_request_aborted_before_vllm_could_allocate_it_leaves_nothing_in_the_connector(tmp_path):
    """It left its prefix-hit count (matched_tokens' _local_hits) for the engine's life before
    finished() dropped it: a leak in engines kept between runs. Its KV, sent all the same by the
    prefill engine, must be released when it comes: the worker is told its transfer id (dropped);
    under load in make test-full it stayed in the decode worker's inbox, with the sender's staging
    space (aborts/full_cache: kv_leak)."""
    s = make_scheduler(tmp_path, num_blocks=8)
    matched = record_matches(s)
    other = make_request("other", 20, 1000, max_tokens=4)  # 5 of the 7 usable blocks
    s.add_request(other)
    step(s)
    d = make_request("d", 17, 100, push_params("t-d", early=True))  # 4 blocks to load into: no room
    s.add_request(d)
    step(s)
    assert d.status == RequestStatus.WAITING and ("d", 0, (16, True)) in matched
    s.finish_requests("d", RequestStatus.FINISHED_ABORTED)  # the client gave up waiting
    dropped = []
    while s.requests:
        dropped += step(s)[1].dropped
    assert dropped == ["t-d"]
    assert free_blocks(s) == usable_blocks(s)  # vLLM let go of everything
    assert_nothing_held(s)


# ---------------------------------------------------------------- decode: own prefix cache


def test_a_prompt_already_in_the_decode_prefix_cache_is_drained_not_parked(tmp_path):
    s = make_scheduler(tmp_path)
    first = make_request("first", 17, 100, max_tokens=1)  # the same prompt, without a transfer
    s.add_request(first)
    out, _, _ = step(s)
    assert out.scheduled_new_reqs[0].block_ids == ([1, 2, 3, 4, 5],)
    d = make_request("d", 17, 100, push_params("t-d", early=True), max_tokens=2)
    s.add_request(d)
    out, meta, _ = step(s)
    # tokens [0, 16) are cached here: vLLM computes the last one at once
    assert d.status == RequestStatus.RUNNING and out.num_scheduled_tokens == {"d": 1}
    assert meta.parked == meta.loads == []
    (drain,) = meta.drains
    assert (drain.req_id, drain.transfer_id, drain.block_ids, drain.skip_blocks) == ("d", "t-d", [1, 2, 3, 4], 4)
    assert drain.written_block_ids == [] and set(meta.scheduled) == {"d"}
    step(s)
    assert d.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert_nothing_held(s)


# ---------------------------------------------------------------- prefill


@pytest.mark.parametrize(("max_num_batched_tokens", "threshold", "chunks", "sent"), [
    (64, 0, [17], [1, 2, 3, 4]),
    (8, 0, [8, 8, 1], [1, 2, 3, 4]),
    (64, 6, [6, 6, 5], [1, 2, 4, 6]),  # `other` takes block 3 in the first step, 5 in the second
], ids=["whole", "chunked-by-batch", "chunked-by-threshold"])
def test_a_prefill_request_is_sent_once_in_the_step_that_computes_its_last_prompt_token(
        tmp_path, max_num_batched_tokens, threshold, chunks, sent):
    s = make_scheduler(tmp_path, "prefill", max_num_batched_tokens=max_num_batched_tokens,
                       long_prefill_token_threshold=threshold)
    p = make_request("p", 17, 100, push_params("t-p"), max_tokens=1)
    s.add_request(p)
    if threshold:  # vLLM 0.32 caps a prefill at the threshold only while another request is there to starve
        s.add_request(make_request("other", 4, 1000, max_tokens=3))
    scheduled, sends, allocated = [], [], []
    for _ in range(10):
        out, meta, _ = step(s)
        scheduled.append(out.num_scheduled_tokens.get("p", 0))
        cached = out.scheduled_cached_reqs
        for blocks in [n.block_ids for n in out.scheduled_new_reqs if n.req_id == "p"] + \
                [cached.new_block_ids[i] for i, r in enumerate(cached.req_ids) if r == "p"]:
            allocated += blocks[0] if blocks else []  # None: no new block this step
        sends.append([(r.req_id, r.transfer_id, r.block_ids, r.num_tokens) for r in meta.sends])
        if not s.requests:
            break
    n = len(chunks)
    assert scheduled[:n] == chunks and not any(scheduled[n:])
    # the blocks vLLM gave it for prompt tokens [0, 16); the fifth holds only token 16
    assert allocated[:4] == sent and len(allocated) == 5
    assert sends == [[]] * (n - 1) + [[("p", "t-p", sent, 16)]] + [[]] * (len(sends) - n)
    assert p.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert_nothing_held(s)
    (rec,) = compute_records(tmp_path, "prefill")
    assert (rec["side"], rec["computed_tokens"], rec["loaded_tokens"]) == ("prefill", 17, 0)

