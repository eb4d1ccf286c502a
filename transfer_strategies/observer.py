"""A connector that moves nothing: it digests, on both engines, the KV another connector moves.

vLLM's own connectors (NixlConnector, ...) move a request's KV their own way. The harness composes
such a connector with this one through vLLM's MultiConnector (a strategy YAML's `observed: true`,
harness/engine_config.py), which calls both at every hook and loads through the first one that
has tokens to give: this one never has. So the KV of a vLLM connector is judged as this project's
strategies' is, block by block on both sides (records.TransferRecord, the same digests), and its
engines write the same compute records (records.ComputeRecord).

  prefill  When vLLM finishes a request, its prompt's KV is computed. This connector holds the
           request's blocks (request_finished says "still sending", as a connector sending
           asynchronously does) until its worker has digested them at the next step; the send
           record carries those digests, and when the request finished (t_forward_done).
  decode   When vLLM first schedules a request, the other connector has loaded its KV: vLLM
           schedules a request it parked for an asynchronous load only once the load is done
           (its connector said so: finished_recving, stamped t_kv_ready), and a synchronous
           load runs in the other connector's start_load_kv, before this one's. The worker
           digests the blocks holding the prompt past the engine's own prefix-cache hits before
           the step's forward pass writes the last prompt token again (vLLM recomputes it after a
           whole prompt was loaded); the receive record carries them. `check.corrupt` damages
           those blocks first (negative_control.py): the outside corruption the digests must catch.

What is seen from outside is less than a strategy of this project records: no bytes or messages
on the wire, no send or transfer time; the timeline has the request's admission, the step that
told the other connector to load (t_load_start), its load reported done (t_kv_ready), the digests
launched and the first decode step scheduled.

The blocks compared are whole blocks: the prompt's, to its last (partial) block, as a connector
that copies blocks (NIXL) writes them. A connector that loads fewer of the prompt's tokens than
the prompt leaves blocks the decode engine computed itself, whose digests may differ.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from transfer_strategies import kv_transfer_params
from transfer_strategies.base import engine_placement
from transfer_strategies.connector_config import ConnectorConfig, ObserverParams
from transfer_strategies.connector_stats import Tally
from transfer_strategies.kv_blocks import KVBlocks
from transfer_strategies.kv_groups import blocks_for
from transfer_strategies.negative_control import corrupt_received
from transfer_strategies.recorder import TransferRecorder
from transfer_strategies.records import ComputeRecord, RecordWriters, compute_path, rank_path
from transfer_strategies.scheduler import (
    Asked,
    Progress,
    TransferRequest,
    count_computed,
    records_of,
    single_group,
    transfer_id_of,
)

# vLLM's statuses of a request that ended as asked (its prompt computed): not aborted, not failed
ENDED_AS_ASKED = ("FINISHED_LENGTH_CAPPED", "FINISHED_STOPPED")


@dataclass
class Observed:
    """A request this engine's scheduler watches until its KV is digested."""

    asked: Asked = field(default_factory=Asked)  # its records file; decode: whether to damage its KV (check.corrupt)
    local_hits: int = 0  # decode: prompt tokens the engine's own prefix cache held when its blocks were allocated
    t_admitted: float | None = None
    t_load_start: float | None = None  # decode: the first step built after its blocks were allocated
    t_kv_ready: float | None = None  # decode: the other connector reported its load done


@dataclass
class Digest:
    """One request's blocks for the worker to digest this step, with the stamps of its record."""

    req: TransferRequest
    times: dict = field(default_factory=dict)
    at_bind: bool = True  # before the step's forward pass; False: after the other connector's start_load_kv


@dataclass
class ObservedMetadata(KVConnectorMetadata):
    digests: list[Digest] = field(default_factory=list)


class ObserverScheduler:
    """The scheduler side: which requests it watches, and when their blocks are to be digested."""

    def __init__(self, is_producer: bool, block_size: int, records: RecordWriters):
        self.is_producer, self.block_size, self.records = is_producer, block_size, records
        self._accounts: dict[str, ComputeRecord] = {}  # req id -> its counts (requests with a transfer id)
        self._watched: dict[str, Observed] = {}
        self._next = ObservedMetadata()

    def asked(self, request, num_computed_tokens: int) -> None:
        """vLLM asked the connectors what they can load: the engine's own prefix-cache hits, as
        they are when it last asks before it allocates the request's blocks."""
        if self.is_producer or transfer_id_of(request) is None:
            return
        watched = self._watched.setdefault(request.request_id, Observed())
        if watched.t_admitted is None:
            watched.local_hits = num_computed_tokens

    def allocated(self, request) -> None:
        tid = transfer_id_of(request)
        if tid is None:
            return
        rid = request.request_id
        watched = self._watched.setdefault(rid, Observed())
        if watched.t_admitted is not None:  # allocated the rest once its load was done: not a preemption
            return
        watched.t_admitted = time.monotonic()
        watched.asked = Asked(records=records_of(request),
                              corrupt=not self.is_producer and kv_transfer_params.corrupts(request.kv_transfer_params))
        if rid not in self._accounts:
            self._accounts[rid] = ComputeRecord(tid, "prefill" if self.is_producer else "decode", rid,
                                                len(request.prompt_token_ids))
        self._accounts[rid].admissions += 1

    def loads_done(self, req_ids) -> None:
        """The other connector reported these requests' asynchronous loads done."""
        now = time.monotonic()
        for rid in req_ids or ():
            if rid in self._watched:
                self._watched[rid].t_kv_ready = now

    def step_metadata(self, out) -> ObservedMetadata:
        meta, self._next = self._next, ObservedMetadata()
        now = time.monotonic()
        count_computed(self._accounts, out)
        if self.is_producer:
            return meta
        for watched in self._watched.values():  # the other connector's worker hears of the load in this step
            if watched.t_admitted is not None and watched.t_load_start is None:
                watched.t_load_start = now
        for new in out.scheduled_new_reqs:
            watched = self._watched.pop(new.req_id, None)
            account = self._accounts.get(new.req_id)
            if watched is None or account is None or account.admissions > 1:  # preempted: its KV was digested
                continue
            # the prompt tokens vLLM did not compute here, bar the last (computed again after a whole prompt)
            account.loaded_tokens += max(new.num_computed_tokens - watched.local_hits, 0)
            n = account.prompt_tokens
            blocks = list(single_group(new.block_ids))[: blocks_for(n, self.block_size)]
            req = TransferRequest(account.transfer_id, new.req_id, blocks, n, watched.local_hits // self.block_size,
                                  asked=watched.asked, progress=Progress(t_admitted=watched.t_admitted))
            times = {"t_admitted": watched.t_admitted, "t_load_start": watched.t_load_start,
                     "t_kv_ready": watched.t_kv_ready, "t_decode_scheduled": now}
            meta.digests.append(Digest(req, times, at_bind=watched.t_kv_ready is not None))
        return meta

    def finished(self, request, block_ids: list[int]) -> bool:
        """Writes the request's compute record; True where its blocks stay until digested (prefill)."""
        rid = request.request_id
        watched = self._watched.pop(rid, None)
        account = self._accounts.pop(rid, None)
        writer = self.records.get(records_of(request)) if account is not None else None
        if writer is not None:
            writer.write(account)
        if not self.is_producer or account is None or request.status.name not in ENDED_AS_ASKED or not block_ids:
            return False
        watched = watched or Observed()
        n = account.prompt_tokens
        req = TransferRequest(account.transfer_id, rid, list(block_ids)[: blocks_for(n, self.block_size)], n,
                              asked=watched.asked, progress=Progress(t_admitted=watched.t_admitted))
        self._next.digests.append(Digest(req, {"t_admitted": watched.t_admitted, "t_forward_done": time.monotonic()}))
        return True


class ObserverWorker:
    """The worker side: digests what the scheduler side lists, records it, and says which
    prefill requests' blocks it is done with."""

    def __init__(self, config: ConnectorConfig, is_producer: bool):
        self.config, self.is_producer = config, is_producer
        self.kv: KVBlocks | None = None
        self.recorder: TransferRecorder | None = None
        self._done: set[str] = set()  # prefill: req ids digested, their blocks for vLLM to free

    def register(self, kv_caches: dict, num_blocks: int, place) -> None:
        h = self.config.harness
        self.kv = KVBlocks(kv_caches, num_blocks, len(place.heads))
        writers = RecordWriters(h.stats_path, lambda path: rank_path(path, place.rank))
        self.recorder = TransferRecorder(self.config.strategy.observed, self.is_producer, True, self.kv, place,
                                         writers, Tally(), sees_wire=False)

    def digest(self, meta: ObservedMetadata, at_bind: bool) -> None:
        for d in meta.digests:
            if d.at_bind != at_bind:
                continue
            if d.req.asked.corrupt:
                corrupt_received(self.kv, d.req)
            self.recorder.record(d.req, "send" if self.is_producer else "receive", **d.times)
            if self.is_producer:
                self._done.add(d.req.req_id)

    def finished_sending(self) -> set[str]:
        done, self._done = self._done, set()
        return done

    def close(self) -> None:
        if self.recorder is not None:
            self.recorder.flush()


class KVObserver(KVConnectorBase_V1):
    """The facade vLLM calls (one part per role, as base.TransferConnector)."""

    Params = ObserverParams

    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        cfg = self._kv_transfer_config
        config = ConnectorConfig.parse(cfg.kv_connector_extra_config, ObserverParams)
        self.is_producer = cfg.kv_role == "kv_producer"
        self.block_size = vllm_config.cache_config.block_size
        self.scheduler = self.worker = None
        if role == KVConnectorRole.SCHEDULER:
            records = RecordWriters(config.harness.stats_path, compute_path)
            self.scheduler = ObserverScheduler(self.is_producer, self.block_size, records)
        else:
            self.worker = ObserverWorker(config, self.is_producer)

    # ------------------------------------------------------------ vLLM: scheduler side
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        self.scheduler.asked(request, num_computed_tokens)
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        self.scheduler.allocated(request)

    def update_connector_output(self, connector_output) -> None:
        self.scheduler.loads_done(connector_output.finished_recving)

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        return self.scheduler.step_metadata(scheduler_output)

    def request_finished(self, request, block_ids):
        return self.scheduler.finished(request, block_ids), None

    # ------------------------------------------------------------ vLLM: worker side
    def register_kv_caches(self, kv_caches: dict) -> None:
        place = engine_placement(self._vllm_config, self.worker.config.harness, self.is_producer)
        self.worker.register(kv_caches, self._kv_cache_config.num_blocks, place)

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        """Before the step's forward pass (vLLM 0.32 may call start_load_kv after it)."""
        super().bind_connector_metadata(connector_metadata)
        self.worker.digest(connector_metadata, at_bind=True)

    def start_load_kv(self, forward_context, **kwargs) -> None:
        self.worker.digest(self._get_connector_metadata(), at_bind=False)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs) -> None:
        return

    def wait_for_save(self) -> None:
        return

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return (self.worker.finished_sending() or None) if self.is_producer else None, None

    def shutdown(self):
        if self.worker is not None:
            self.worker.close()
