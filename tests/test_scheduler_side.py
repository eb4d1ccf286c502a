"""The scheduler side (RequestTracker) on the objects vLLM's scheduler hands it: which blocks
each request moves, and in which step, for whole and chunked prefills, preemption and decode
prefix-cache hits."""

import time
from types import SimpleNamespace as NS

import torch

from transfer_strategies.kv_groups import KVGroups, page_pools
from transfer_strategies.scheduler import RequestTracker

BLOCK = 4


def request(rid: str, prompt_len: int, transfer_id: str | None = "t", records: str | None = None):
    params = {"transfer_id": transfer_id} if transfer_id else None
    if records:
        params["records"] = records
    return NS(request_id=rid, prompt_token_ids=list(range(prompt_len)), kv_transfer_params=params)


def step(new=(), cached=(), scheduled=None, resumed=()):
    """A SchedulerOutput: new = [(rid, block_ids, computed)], cached = [(rid, new_block_ids, computed)]."""
    return NS(scheduled_new_reqs=[NS(req_id=r, block_ids=(b,), num_computed_tokens=c) for r, b, c in new],
              scheduled_cached_reqs=NS(req_ids=[r for r, _, _ in cached],
                                       new_block_ids=[None if b is None else (b,) for _, b, _ in cached],
                                       num_computed_tokens=[c for _, _, c in cached], resumed_req_ids=set(resumed)),
              num_scheduled_tokens=scheduled or {}, total_num_scheduled_tokens=sum((scheduled or {}).values()))


def test_prefill_sends_the_blocks_of_all_but_the_last_prompt_token_after_its_step():
    t = RequestTracker(is_producer=True, block_size=BLOCK)
    r = request("a", prompt_len=9)  # tokens [0, 8) move: 2 blocks; the third holds only token 8
    assert t.matched_tokens(r, 0) == (0, False)
    t.allocated(r, None)
    (send,) = t.step_metadata(step(new=[("a", [7, 3, 5], 0)], scheduled={"a": 9})).sends
    assert (send.transfer_id, send.block_ids, send.num_tokens) == ("t", [7, 3], 8)
    assert t.step_metadata(step()).sends == []  # sent once


def test_chunked_prefill_sends_after_the_step_that_computes_the_last_token():
    t = RequestTracker(is_producer=True, block_size=BLOCK)
    t.allocated(request("a", prompt_len=12), None)
    first = t.step_metadata(step(new=[("a", [1, 2], 0)], scheduled={"a": 8}))
    assert first.sends == []
    # the step computing part of the prompt lists it as a chunk (chunkwise sends what it completed)
    (chunk,) = first.chunks
    assert chunk.block_ids == [1, 2] and chunk.computed_tokens == 8
    last = t.step_metadata(step(cached=[("a", [9], 8)], scheduled={"a": 4}))
    (send,) = last.sends
    assert send.block_ids == [1, 2, 9] and send.computed_tokens == 11 and last.chunks == []


def test_a_preempted_prefill_moves_the_blocks_it_resumed_with():
    t = RequestTracker(is_producer=True, block_size=BLOCK)
    t.allocated(request("a", prompt_len=12), None)
    t.step_metadata(step(new=[("a", [1, 2], 0)], scheduled={"a": 8}))
    (send,) = t.step_metadata(step(cached=[("a", [5, 6, 7], 0)], scheduled={"a": 12}, resumed={"a"})).sends
    assert send.block_ids == [5, 6, 7]


def test_requests_without_a_transfer_id_are_not_touched():
    for producer in (True, False):
        t = RequestTracker(is_producer=producer, block_size=BLOCK)
        r = request("a", 9, transfer_id=None)
        assert t.matched_tokens(r, 0) == (0, False)
        t.allocated(r, NS(get_block_ids=lambda: ([1, 2, 3],)))
        meta = t.step_metadata(step(new=[("a", [1, 2, 3], 0)], scheduled={"a": 9}))
        assert meta.sends == [] and meta.loads == []


def test_decode_loads_all_but_the_last_token_past_its_own_prefix_hits():
    t = RequestTracker(is_producer=False, block_size=BLOCK)
    r = request("a", prompt_len=10)
    assert t.matched_tokens(r, num_computed_tokens=4) == (5, False)  # 9 move, 4 were cached here
    t.allocated(r, NS(get_block_ids=lambda: ([4, 8, 2],)))
    (load,) = t.step_metadata(step()).loads
    assert (load.block_ids, load.skip_blocks, load.num_tokens) == ([4, 8, 2], 1, 9)
    assert t.step_metadata(step()).loads == []


def test_a_finished_request_is_forgotten():
    t = RequestTracker(is_producer=True, block_size=BLOCK)
    r = request("a", 9)
    t.allocated(r, None)
    t.finished(r)
    assert t.step_metadata(step(new=[("a", [1, 2, 3], 0)], scheduled={"a": 9})).sends == []


def early(rid: str, prompt_len: int):
    return NS(request_id=rid, prompt_token_ids=list(range(prompt_len)),
              kv_transfer_params={"transfer_id": "t-" + rid, "load": "async"})


def test_an_early_decode_request_is_parked_until_its_kv_is_in_then_stamped_when_scheduled():
    t = RequestTracker(is_producer=False, block_size=BLOCK)
    r = early("a", prompt_len=10)
    assert t.matched_tokens(r, 0) == (9, True)  # vLLM parks it (WAITING_FOR_REMOTE_KVS)
    t.allocated(r, NS(get_block_ids=lambda: ([4, 8, 2],)), num_external_tokens=9)
    meta = t.step_metadata(step())
    assert meta.loads == [] and [p.block_ids for p in meta.parked] == [[4, 8, 2]] and meta.scheduled == {}
    assert meta.idle  # nothing scheduled: the worker may wait for the KV
    # released by get_finished: vLLM admits it again (no external tokens this time): not a new transfer
    t.allocated(r, NS(get_block_ids=lambda: ([4, 8, 2],)), num_external_tokens=0)
    meta = t.step_metadata(step(new=[("a", [4, 8, 2], 9)], scheduled={"a": 1}))
    assert meta.drains == [] and meta.loads == []
    assert set(meta.scheduled) == {"a"} and not meta.idle and meta.parked == []
    t.finished(r)
    assert t.step_metadata(step()).cancelled == []  # it was no longer parked


def test_an_early_request_with_nothing_to_load_is_not_parked_but_takes_its_message():
    t = RequestTracker(is_producer=False, block_size=BLOCK)
    r = early("a", prompt_len=9)
    assert t.matched_tokens(r, 8) == (0, False)  # all in this engine's prefix cache: vLLM would assert
    t.allocated(r, NS(get_block_ids=lambda: ([4, 8, 2],)), num_external_tokens=0)
    meta = t.step_metadata(step(new=[("a", [4, 8, 2], 8)], scheduled={"a": 1}))
    assert meta.parked == [] and [d.skip_blocks for d in meta.drains] == [2] and set(meta.scheduled) == {"a"}


def test_a_request_finished_while_parked_is_cancelled_for_the_worker():
    t = RequestTracker(is_producer=False, block_size=BLOCK)
    r = early("a", prompt_len=10)
    t.matched_tokens(r, 0)
    t.allocated(r, NS(get_block_ids=lambda: ([4, 8, 2],)), num_external_tokens=9)
    t.step_metadata(step())
    t.finished(r)  # aborted, or failed by vLLM's kv_load_failure_policy
    assert t.step_metadata(step()).cancelled == ["a"]
    assert t.step_metadata(step()).cancelled == []


def test_a_request_parked_past_the_timeout_is_listed_expired_once_for_every_worker():
    """The timeout is the scheduler side's clock: one step's metadata lists the request as expired
    to every worker at once (under TP, a worker failing it alone left vLLM waiting for the others'
    report, which an idle engine never asked for: a block held after the last request)."""
    t = RequestTracker(is_producer=False, block_size=BLOCK, timeout_s=0.05)
    r = early("a", prompt_len=10)
    t.matched_tokens(r, 0)
    t.allocated(r, NS(get_block_ids=lambda: ([4, 8, 2],)), num_external_tokens=9)
    assert t.step_metadata(step()).expired == []
    time.sleep(0.06)
    assert t.step_metadata(step()).expired == ["a"]
    assert t.step_metadata(step()).expired == []  # once
    t.finished(r)  # failed by vLLM once the workers reported its blocks
    meta = t.step_metadata(step())
    assert meta.cancelled == ["a"] and meta.expired == [] and t._parked == {} and t._expired == set()


class Recorded(list):
    """The compute records written (in place of records.RecordWriters), and the file each named."""
    write = list.append

    def __init__(self):
        super().__init__()
        self.named: list[str | None] = []

    def get(self, named=None):
        self.named.append(named)
        return self


def test_decode_counts_what_vllm_scheduled_it_to_compute_and_what_it_loaded():
    records = Recorded()
    t = RequestTracker(is_producer=False, block_size=BLOCK, records=records)
    r = request("a", prompt_len=10)
    t.matched_tokens(r, num_computed_tokens=4)
    t.allocated(r, NS(get_block_ids=lambda: ([4, 8, 2],)), num_external_tokens=5)
    t.step_metadata(step(new=[("a", [4, 8, 2], 9)], scheduled={"a": 1}))  # the last prompt token
    t.step_metadata(step(cached=[("a", None, 10)], scheduled={"a": 1}))  # a generated token: not the prompt's
    t.finished(r)
    (rec,) = records
    assert (rec.side, rec.prompt_tokens, rec.computed_tokens, rec.loaded_tokens, rec.cached_tokens) == \
        ("decode", 10, 1, 5, 9)
    assert rec.recomputed_tokens == 0 and rec.preemptions == 0


def test_a_request_that_names_its_records_file_has_its_records_go_there():
    """Engines kept between runs: each run's requests name their own run's files."""
    records = Recorded()
    t = RequestTracker(is_producer=False, block_size=BLOCK, records=records)
    r = request("a", prompt_len=10, records="/runs/2/decode-transfers.jsonl")
    t.matched_tokens(r, 0)
    t.allocated(r, NS(get_block_ids=lambda: ([4],)), num_external_tokens=9)
    (load,) = t.step_metadata(step(new=[("a", [4], 9)], scheduled={"a": 1})).loads
    assert load.asked.records == "/runs/2/decode-transfers.jsonl"  # the worker's transfer record too
    t.finished(r)
    assert records.named == ["/runs/2/decode-transfers.jsonl"] and len(records) == 1


def test_the_negative_control_is_asked_for_by_the_decode_request():
    """check.corrupt travels in kv_transfer_params: one engine pair runs real and corrupted passes."""
    t = RequestTracker(is_producer=False, block_size=BLOCK)
    plain, damaged = request("a", prompt_len=10), request("b", prompt_len=10, transfer_id="u")
    damaged.kv_transfer_params["corrupt"] = True
    for r, blocks in ((plain, [4]), (damaged, [5])):
        t.matched_tokens(r, 0)
        t.allocated(r, NS(get_block_ids=lambda b=blocks: (b,)), num_external_tokens=9)
    loads = t.step_metadata(step(new=[("a", [4], 9), ("b", [5], 9)], scheduled={"a": 1, "b": 1})).loads
    assert {load.req_id: load.asked.corrupt for load in loads} == {"a": False, "b": True}


def test_a_decode_request_that_recomputed_its_prompt_is_counted():
    records = Recorded()
    t = RequestTracker(is_producer=False, block_size=BLOCK, records=records)
    r = request("a", prompt_len=10)
    t.matched_tokens(r, 0)
    t.allocated(r, NS(get_block_ids=lambda: ([4, 8, 2],)), num_external_tokens=0)  # vLLM took none
    t.step_metadata(step(new=[("a", [4, 8, 2], 0)], scheduled={"a": 6}))  # chunked
    t.step_metadata(step(cached=[("a", None, 6)], scheduled={"a": 4}))
    t.finished(r)
    assert records[0].computed_tokens == 10 and records[0].recomputed_tokens == 9


def test_a_decode_request_preempted_after_its_kv_came_loads_nothing_again():
    """Its message was taken: waiting for another would time out. vLLM finds what its prefix
    cache still holds and computes the rest; the record counts the preemption."""
    records = Recorded()
    t = RequestTracker(is_producer=False, block_size=BLOCK, records=records)
    r = request("a", prompt_len=10)
    assert t.matched_tokens(r, 0) == (9, False)
    t.allocated(r, NS(get_block_ids=lambda: ([4, 8, 2],)), num_external_tokens=9)
    assert len(t.step_metadata(step(new=[("a", [4, 8, 2], 9)], scheduled={"a": 1})).loads) == 1
    # preempted: admitted again from scratch, its own prefix cache still holding 4 tokens
    assert t.matched_tokens(r, 4) == (0, False)
    t.allocated(r, NS(get_block_ids=lambda: ([4, 6, 7],)), num_external_tokens=0)
    meta = t.step_metadata(step(cached=[("a", [4, 6, 7], 4)], scheduled={"a": 7}, resumed={"a"}))
    assert meta.loads == meta.parked == meta.drains == []
    t.finished(r)
    (rec,) = records
    assert (rec.preemptions, rec.loaded_tokens, rec.computed_tokens, rec.recomputed_tokens) == (1, 9, 7, 6)


def test_a_hybrid_prefill_computes_all_but_the_last_token_and_sends_its_pages_group_by_group():
    """Qwen3-Next's groups as vLLM's hybrid allocator keeps them (kv_groups.py): two of recurrent
    state (a block each per request), one of attention (blocks of 8 tokens here). The prefill
    engine computes 19 of a 20-token prompt; both sides list a request's pages group after group."""
    groups = KVGroups((64, 64, 8), (True, True, False))
    t = RequestTracker(is_producer=True, block_size=8, groups=groups)
    tokens = list(range(20))
    r = NS(request_id="a", prompt_token_ids=list(tokens), _all_token_ids=list(tokens), num_prompt_tokens=20,
           max_tokens=1, kv_transfer_params={"transfer_id": "t"})
    t.new_request(r)
    t.new_request(r)  # added again after a preemption: cut once
    assert (r.prompt_token_ids, r._all_token_ids, r.num_prompt_tokens) == (tokens[:19], tokens[:19], 19)
    t.allocated(r, None)
    out = NS(scheduled_new_reqs=[NS(req_id="a", block_ids=([4], [5], [1, 2, 3]), num_computed_tokens=0)],
             scheduled_cached_reqs=NS(req_ids=[], new_block_ids=[], num_computed_tokens=[], resumed_req_ids=set()),
             num_scheduled_tokens={"a": 19}, total_num_scheduled_tokens=19)
    (send,) = t.step_metadata(out).sends  # its truncated prompt's last token computed: sent
    assert (send.block_ids, send.num_tokens) == ([4, 5, 1, 2, 3], 19)
    d = RequestTracker(is_producer=False, block_size=8, groups=groups)
    whole = request("b", prompt_len=20)
    d.new_request(whole)  # the decode engine's prompt stays whole
    assert d.matched_tokens(whole, 0) == (19, False) and len(whole.prompt_token_ids) == 20
    d.allocated(whole, NS(get_block_ids=lambda: ([9], [8], [6, 7, 10])), 19)
    (load,) = d.step_metadata(step()).loads
    assert (load.block_ids, load.num_tokens) == ([9, 8, 6, 7, 10], 19)


def test_a_hybrid_models_layers_are_views_of_one_pool_of_pages():
    """vLLM 0.32 on CPU: every layer's KV cache a view of one buffer, a Gated DeltaNet layer's as
    raw bytes (its state's size, less than a page), the attention layer's as blocks of K and V."""
    n, page = 6, 2 * 2 * 8 * 4 * 2  # pages; an attention page: K and V, 2 heads, 8 tokens of 4, bf16
    raw = torch.zeros(n * page, dtype=torch.uint8)
    state = torch.empty(0, dtype=torch.int8).set_(raw.untyped_storage(), 0, (n, 1, 1, 200), (page, 200, 200, 1))
    attention = raw.view(torch.bfloat16).view(n, 2, 8, 8)
    (name, pool), = page_pools({"linear_attn": state, "self_attn": attention}, n).items()
    assert name == "pool:linear_attn" and pool.shape == (n, page) and pool.data_ptr() == raw.data_ptr()
    pool[3] = 7  # a page is a block of either kind of layer
    assert (state[3].view(torch.uint8) == 7).all() and (attention[3].view(torch.uint8) == 7).all()
    assert attention[2].view(torch.uint8).eq(0).all()
    assert KVGroups((8,), (False,)).request_blocks([[1, 2, 3]], 9) == [1, 2]
    assert KVGroups((64, 8), (True, False)).request_blocks([[5], [1, 2, 3]], 0) == []  # nothing to send
