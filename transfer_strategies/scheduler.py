"""Scheduler side of a connector: which blocks each request owns on this engine, and in which
step its KV moves. It runs in vLLM's scheduler and hands the worker side a `TransferMetadata`
each step (vLLM's `build_connector_meta`).

How a request flows (the harness drives it):
  1. The prefill engine gets the prompt with max_tokens=1 and kv_transfer_params
     {"transfer_id": id}. Once a step computes the prompt's last token (with chunked prefill,
     after several steps), that step's metadata carries a `TransferRequest` with the request's
     block ids in `sends`; the worker sends after (or while) that step's forward pass.
  2. The decode engine gets the same prompt and transfer id. Its scheduler asks how many prompt
     tokens come from outside (`get_num_new_matched_tokens`): all but the last, which vLLM must
     compute itself to produce logits, less what its own prefix cache already holds. It
     allocates blocks, and then either
     - hand-off (the decode request comes after the prefill engine answered): their ids go to
       the worker in `loads`, which writes the received blocks into them before this step's
       forward pass; or
     - early submission (kv_transfer_params {"load": "async"}: the decode request was submitted
       with the prefill request, before its KV exists): vLLM parks the request
       (WAITING_FOR_REMOTE_KVS, its blocks held) and the ids go to the worker in `parked`; the
       worker writes the blocks when the KV has arrived and reports the request finished
       receiving (`get_finished`), which releases it to vLLM's next step. A request aborted
       while parked is listed in `cancelled`, so the worker reports it too and vLLM frees its
       blocks; one aborted before vLLM admitted it (still waiting: no blocks yet) has its transfer
       id listed in `dropped`, so the worker releases its KV when it comes. A request whose
       blocks were all in this engine's prefix cache is not parked (vLLM computes its last
       token at once); its message is still taken (`drains`), when it arrives, so the sender's
       staging space is freed (it wrote nothing: no digest judges it).
Both sides move the blocks holding prompt tokens [0, prompt_len - 1), so their counts agree.

Both sides stamp when vLLM admitted the request (`t_admitted`) and, on the decode side, when the
step that computes its first token was scheduled (`scheduled`), for the request's timeline.

Preemption: vLLM frees a preempted request's blocks and admits it again later, from scratch. Its
message was taken at the first admission, so a decode request admitted again loads nothing: vLLM
finds what its own prefix cache still holds of the blocks (the KV delivered again) and computes
the rest (recomputed). Each engine's scheduler side counts, from vLLM's scheduler outputs, the
prompt tokens it had the model compute and those it took from the connector, and writes them
when vLLM frees the request (`records.ComputeRecord`): the record says which it was.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

from transfer_strategies import kv_transfer_params
from transfer_strategies.kv_groups import KVGroups
from transfer_strategies.records import ComputeRecord, RecordWriters


@dataclass
class Asked:
    """What a request's kv_transfer_params asked this engine's connector for (kv_transfer_params.py)."""

    records: str | None = None  # the file its records go to (None: the connector's harness.stats_path)
    corrupt: bool = False  # decode: damaged once received (the negative control)
    fault: str | None = None  # prefill: the transport fault injected into this transfer (faults.py)
    fault_delay_s: float | None = None  # prefill: how late a delayed transfer's messages leave
    peer: int | None = None  # prefill: the decode instance it goes to, of several (kv_transfer_params.PEER)


@dataclass
class Progress:
    """The worker's bookkeeping while it moves the request."""

    t_admitted: float | None = None  # time.monotonic() when this engine's scheduler allocated its blocks
    clock: Any = None  # the send's SendClock, or the receive's start time (None: not begun)
    bytes: int = 0
    messages: int = 0
    received: list = field(default_factory=list)  # the transport's Messages
    # a lossy strategy's (codecs.py): the codec's time (a DeviceTimer's stop()), and the
    # receiver's checksum of the payload as it arrived (codec_checks.PayloadCheck)
    codec_ms: Any = None
    payload_check: Any = None
    hook_ms: float = 0.0  # a streaming send's host time in the forward pass's per-layer hooks


@dataclass
class TransferRequest:
    """One request's KV as one engine sees it. A strategy reads the first five fields and owns
    `prepared`; `asked` and `progress` are the worker's."""

    transfer_id: str
    req_id: str
    block_ids: list[int]  # this engine's blocks holding prompt tokens [0, num_tokens)
    num_tokens: int  # prompt_len - 1: the tokens whose KV moves
    skip_blocks: int = 0  # decode only: leading blocks this engine already has (prefix cache)
    # prefill only: of those tokens, how many have their KV computed once this step's forward pass ends
    computed_tokens: int = 0
    prepared: Any = None  # whatever the strategy's prepare_send left for its send (None: it has not run)
    asked: Asked = field(default_factory=Asked)
    progress: Progress = field(default_factory=Progress)

    @property
    def written_block_ids(self) -> list[int]:
        """The blocks a transfer writes on this engine: on the decode side those past its own
        prefix-cache hits (the engine computed or loaded the others earlier, maybe in other bits)."""
        return self.block_ids[self.skip_blocks:]


@dataclass
class TransferMetadata(KVConnectorMetadata):
    sends: list[TransferRequest] = field(default_factory=list)
    # prefill: requests whose prompt this step computes a part of, not its end (chunked prefill):
    # their blocks so far and computed_tokens; they are in `sends` in the step that ends the prompt
    chunks: list[TransferRequest] = field(default_factory=list)
    # prefill: sends this worker only records (another worker sends the KV it holds too: MLA's latent under TP)
    recorded_only: list[TransferRequest] = field(default_factory=list)
    loads: list[TransferRequest] = field(default_factory=list)  # decode: load before this step's forward pass
    parked: list[TransferRequest] = field(default_factory=list)  # decode: load when the KV has arrived
    drains: list[TransferRequest] = field(default_factory=list)  # decode: nothing to load; take the message
    cancelled: list[str] = field(default_factory=list)  # decode: req ids finished while parked
    # decode: parked req ids whose KV did not come within the timeout (the scheduler side's clock,
    # so that every worker of a tensor-parallel engine fails a request in the same step)
    expired: list[str] = field(default_factory=list)
    # decode: transfer ids of requests that finished before vLLM admitted them (aborted while waiting):
    # their KV is released whenever it comes, so the sender's staging space comes back
    dropped: list[str] = field(default_factory=list)
    scheduled: dict[str, float] = field(default_factory=dict)  # decode: req id -> when its first step was scheduled
    idle: bool = False  # no tokens scheduled this step: the worker may wait for KV to arrive


def transfer_id_of(request) -> str | None:
    return kv_transfer_params.transfer_id_of(request.kv_transfer_params)


def loads_async(request) -> bool:
    return kv_transfer_params.loads_async(request.kv_transfer_params)


def records_of(request) -> str | None:
    return kv_transfer_params.records_of(request.kv_transfer_params)


def single_group(block_ids):
    if len(block_ids) != 1:
        raise NotImplementedError("transfer strategies support one KV cache group (no hybrid models)")
    return block_ids[0]


def count_computed(accounts: dict[str, ComputeRecord], out) -> None:
    """Add the prompt tokens each request's step computes, as vLLM scheduled them (`out`: its
    SchedulerOutput), to the request's compute record in `accounts` (req id -> record)."""
    steps = [(new.req_id, new.num_computed_tokens, True) for new in out.scheduled_new_reqs]
    cached = out.scheduled_cached_reqs
    steps += [(rid, cached.num_computed_tokens[i], False) for i, rid in enumerate(cached.req_ids)]
    for rid, done, new in steps:
        account = accounts.get(rid)
        if account is None:
            continue
        if new and account.cached_tokens is None:
            account.cached_tokens = done
        n = out.num_scheduled_tokens.get(rid, 0)
        account.computed_tokens += max(min(done + n, account.prompt_tokens) - done, 0)


class RequestTracker:
    """The scheduler side's state: prefill requests whose KV has not left yet, and decode
    requests whose blocks were allocated since the last step or that wait for their KV."""

    def __init__(self, is_producer: bool, block_size: int, records: RecordWriters | None = None,
                 timeout_s: float = 300.0, groups: KVGroups | None = None):
        """groups: the engine's KV cache groups (kv_groups.py; None: one, of block_size)."""
        self.is_producer = is_producer
        self.groups = groups or KVGroups((block_size,), (False,))
        self.block_size = self.groups.token_block_size
        self.timeout_s = timeout_s  # decode: how long a parked request waits for its KV
        # where each request's ComputeRecord goes when vLLM frees it
        self.records = records if records is not None else RecordWriters(None)
        self._computed: dict[str, ComputeRecord] = {}  # req_id -> its counts so far (requests with a transfer id)
        self._sends: dict[str, TransferRequest] = {}  # prefill: req_id -> blocks so far
        self._local_hits: dict[str, int] = {}  # decode: req_id -> tokens its prefix cache held
        self._next = TransferMetadata()  # decode: loads, parked, drains and cancels for the next step
        # decode: req ids vLLM holds until the workers have loaded them -> when they were parked
        self._parked: dict[str, float] = {}
        self._expired: set[str] = set()  # decode: parked req ids already listed as expired
        self._group_blocks: dict[str, list[list[int]]] = {}  # prefill: req_id -> its blocks so far, per group
        self._truncated: set[str] = set()  # prefill, hybrid: req ids computing their prompt but its last token

    def new_request(self, request) -> None:
        """Prefill, a hybrid model: the prompt but its last token is computed (kv_groups.py: a
        recurrent state cannot be cut back, and the decode engine computes that token itself)."""
        if not (self.is_producer and self.groups.hybrid) or transfer_id_of(request) is None:
            return
        if request.num_prompt_tokens <= 1 or request.prompt_token_ids is None:
            return
        if request.request_id in self._truncated:  # preempted and added again: cut once
            return
        request.prompt_token_ids.pop()
        request._all_token_ids.pop()
        request.num_prompt_tokens -= 1
        request.max_tokens = 1
        self._truncated.add(request.request_id)

    def matched_tokens(self, request, num_computed_tokens: int) -> tuple[int, bool]:
        if self.is_producer or transfer_id_of(request) is None:
            return 0, False
        if self._account(request).admissions:  # preempted after its KV came: the message is gone
            return 0, False
        self._local_hits[request.request_id] = num_computed_tokens
        n = max(len(request.prompt_token_ids) - 1 - num_computed_tokens, 0)
        return n, loads_async(request) and n > 0  # vLLM parks a request only for tokens to load

    def allocated(self, request, blocks, num_external_tokens: int = 0) -> None:
        tid = transfer_id_of(request)
        if tid is None or request.request_id in self._parked:  # a parked request admitted again, its KV in
            return
        account = self._account(request)
        account.admissions += 1
        account.loaded_tokens += num_external_tokens
        if account.admissions > 1 and not self.is_producer:  # preempted: loads nothing (see the module's doc)
            self._local_hits.pop(request.request_id, None)
            return
        n_tok = len(request.prompt_token_ids) - (request.request_id not in self._truncated)
        now = time.monotonic()
        if self.is_producer:
            fault, delay_s = kv_transfer_params.fault_of(request.kv_transfer_params)
            asked = Asked(records=records_of(request), fault=fault, fault_delay_s=delay_s,
                          peer=kv_transfer_params.peer_of(request.kv_transfer_params))
            self._sends[request.request_id] = TransferRequest(tid, request.request_id, [], n_tok, asked=asked,
                                                              progress=Progress(t_admitted=now))
            return
        # decode: every request with a transfer id takes its message, even when nothing is
        # loaded (all blocks were already cached here), so the sender's space is freed.
        block_ids = self.groups.request_blocks(blocks.get_block_ids(), n_tok)
        skip = self._local_hits.pop(request.request_id, 0) // self.block_size
        asked = Asked(records=records_of(request), corrupt=kv_transfer_params.corrupts(request.kv_transfer_params))
        req = TransferRequest(tid, request.request_id, block_ids, n_tok, skip, asked=asked,
                              progress=Progress(t_admitted=now))
        if not loads_async(request):
            self._next.loads.append(req)
        elif num_external_tokens > 0:  # vLLM parks it only then
            self._next.parked.append(req)
            self._parked[request.request_id] = now
        else:
            self._next.drains.append(req)

    def _account(self, request) -> ComputeRecord:
        rid = request.request_id
        if rid not in self._computed:
            self._computed[rid] = ComputeRecord(transfer_id_of(request), "prefill" if self.is_producer else "decode",
                                                rid, len(request.prompt_token_ids))
        return self._computed[rid]

    def step_metadata(self, scheduler_output) -> TransferMetadata:
        meta, self._next = self._next, TransferMetadata()
        now = time.monotonic()
        meta.idle = not getattr(scheduler_output, "total_num_scheduled_tokens", 1)
        count_computed(self._computed, scheduler_output)
        if self.is_producer:
            meta.sends, meta.chunks = self._ready_sends(scheduler_output)
            return meta
        for req in meta.loads + meta.drains:  # scheduled in this step
            meta.scheduled[req.req_id] = now
        for new in scheduler_output.scheduled_new_reqs:  # a parked request's first scheduled step
            if self._parked.pop(new.req_id, None) is not None:
                self._expired.discard(new.req_id)
                meta.scheduled[new.req_id] = now
        # vLLM steps while a request is parked, so each is judged here once its time is up
        meta.expired = [rid for rid, since in self._parked.items()
                        if now - since > self.timeout_s and rid not in self._expired]
        self._expired.update(meta.expired)
        return meta

    def _ready_sends(self, out) -> tuple[list[TransferRequest], list[TransferRequest]]:
        """The requests whose prompt this step ends (to send), and those it computes a part of."""
        progress: list[tuple[str, int]] = []  # (req_id, tokens computed before this step)
        for new in out.scheduled_new_reqs:
            if new.req_id in self._sends:
                self._group_blocks[new.req_id] = [list(ids) for ids in new.block_ids]
                progress.append((new.req_id, new.num_computed_tokens))
        cached = out.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            if rid not in self._sends:
                continue
            new_blocks = cached.new_block_ids[i]
            if new_blocks is not None:
                resumed = rid in getattr(cached, "resumed_req_ids", ())  # after preemption: all blocks anew
                so_far = self._group_blocks.get(rid)
                self._group_blocks[rid] = [list(ids) if resumed or so_far is None else so_far[g] + list(ids)
                                           for g, ids in enumerate(new_blocks)]
            progress.append((rid, cached.num_computed_tokens[i]))
        ready, chunks = [], []
        for rid, computed in progress:
            req = self._sends[rid]
            done = computed + out.num_scheduled_tokens.get(rid, 0)
            req.computed_tokens = min(done, req.num_tokens)
            so_far = self._group_blocks.get(rid) or [[] for _ in self.groups.block_sizes]
            req.block_ids = self.groups.request_blocks(so_far, req.num_tokens)
            # send once the step that computes the prompt's last token has run (chunked prefill;
            # a truncated prompt's last token is the last one sent)
            if done >= req.num_tokens + (rid not in self._truncated):
                del self._sends[rid]
                self._group_blocks.pop(rid, None)
                ready.append(req)
            else:
                chunks.append(req)
        return ready, chunks

    def finished(self, request) -> None:
        self._sends.pop(request.request_id, None)
        self._group_blocks.pop(request.request_id, None)
        self._truncated.discard(request.request_id)
        # asked about (matched_tokens) but never allocated: vLLM had no room, then it was aborted
        self._local_hits.pop(request.request_id, None)
        account = self._computed.pop(request.request_id, None)
        writer = self.records.get(records_of(request)) if account is not None else None
        if writer is not None:
            writer.write(account)
        tid = transfer_id_of(request)
        never_admitted = account is None or not account.admissions  # (vLLM may have asked, matched_tokens)
        if never_admitted and tid is not None and not self.is_producer:  # its KV may still come
            self._next.dropped.append(tid)
        if self._parked.pop(request.request_id, None) is not None:  # aborted (or failed) before its KV was loaded
            self._expired.discard(request.request_id)
            self._next.cancelled.append(request.request_id)
