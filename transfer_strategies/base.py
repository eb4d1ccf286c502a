"""The connector every transfer strategy subclasses: a vLLM KV connector (`KVConnectorBase_V1`)
that is a thin facade, as vLLM's own connectors are, over a scheduler-side part
(`scheduler.RequestTracker`: which blocks each request owns, and when it moves) and a
worker-side part (`worker.TransferWorker`: the KV blocks and the channel, and the part of each
role that the facade calls, `send_side.SendSide` or `receive_side.ReceiveSide`, both recording
through `recorder.TransferRecorder`: clocks, digests, records). A strategy only says how blocks
become messages and back.

Writing a strategy: subclass `TransferConnector` and write

    send(req)      prefill worker, after the forward pass that computed req's KV:
                   turn req's blocks into messages with `gather` and `post`
    receive(req)   decode worker, before the forward pass that needs them:
                   `collect` the messages and `scatter` them into this engine's blocks

and optionally `prepare_send(req)`, which runs before that forward pass (plan the copy there,
with `gather_plan`, to keep it off the clock and out of the forward pass). `req` is a
`TransferRequest`: `block_ids` (this engine's blocks holding the prompt's KV, in order) and
`transfer_id`. The API, one way to do each thing:

    self.n_layers                            layers of KV
    self.gather(block_ids, layers=None)      blocks of some layers (default all) copied into a new
                                             send buffer, [len(layers), *block shape]; it lives in
                                             the receiver's staging memory: posting it copies nothing
    self.gather_plan(block_ids, layers=None) the same as a function to call later
    self.post(req, payload, index=0, count=1, **meta)
                                             send message `index` of `count` (any tensor; count 0:
                                             more follow, how many not known yet); meta: small
                                             values the receiver reads in the message's meta
    self.collect(req, index=None)            wait for message `index` (default: all, in order)
    self.scatter(req, payload, layers=None, first_block=0)
                                             a payload holding blocks [first_block, first_block + k)
                                             of req, for `layers`, into this engine's blocks (those
                                             its prefix cache already had are left alone)
    self.kv                                  the `KVBlocks` copy engine, for anything else
    self.params                              the strategy's own parameters: an instance of its
                                             `Params` (below)

Parameters: a strategy that takes some declares them as a frozen dataclass named `Params` on its
class (names, types, defaults; a `Literal` for a fixed set of values), as per_request_blocks.py
does. The harness checks `strategy.params` against it before any engine starts (exit 2 and one
line for an unknown name or a wrong value) and the connector parses the same dataclass
(connector_config.py); a strategy without one takes none.

What a strategy may read of a `TransferRequest`: `transfer_id`, `block_ids`, `num_tokens`,
`skip_blocks`, and `prepared`, which is its own: whatever its `prepare_send` left there for its
`send` (None until then). The rest (`asked`: what the request's kv_transfer_params asked for;
`progress`: clocks, bytes and messages) is the worker's bookkeeping.

Under tensor parallelism every worker of each engine runs the strategy on the KV heads it holds
(tp.py); the channel cuts a payload in the KV dtype by head for each decode worker, and joins a
decode worker's heads from several prefill workers (head_shards.py), so `collect` returns what a
one-worker engine would get; a payload of another dtype goes whole to each decode worker.

A lossy strategy (fused_fp8.py) names a codec format (`codec = "fp8"`, codecs.py) and takes
`codecs.CodecParams` as its Params; it then has

    self.encode_plan(req)                    as gather_plan, for every block and layer of req,
                                             compressed into one payload in the send space
    self.decode_into(req, payload)           as scatter, for such a payload: the blocks it
                                             reconstructs, into this engine's blocks of req

and its checks follow: the sender digests what the receiver will reconstruct (not its own
cache), measures the reconstruction's error against the original, and both sides checksum the
compressed payload with its scales (recorder.py, codec_checks.py).

A strategy that streams from inside the forward pass uses vLLM's per-layer hooks itself
(`save_kv_layer`, `wait_for_layer_load`; see layerwise.py) with `this_step()`, `begin_send(req,
streaming=True)` / `end_send(req)` and `begin_receive(req)` / `end_receive(req)`, which the
default hooks otherwise call around `send` and `receive`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)

from transfer_strategies.clock import DeviceTimer
from transfer_strategies.codecs import Codec
from transfer_strategies.connector_config import ConnectorConfig, HarnessSettings, NoParams
from transfer_strategies.connector_stats import TransferCounts, TransferPromMetrics
from transfer_strategies.faults import TransferFault
from transfer_strategies.kv_blocks import KVBlocks
from transfer_strategies.kv_groups import KVGroups, page_pools
from transfer_strategies.records import RecordWriters, compute_path
from transfer_strategies.scheduler import RequestTracker, TransferMetadata, TransferRequest
from transfer_strategies.tp import Placement
from transfer_strategies.transport import Message
from transfer_strategies.worker import TransferWorker

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import SchedulerOutput

__all__ = ["TransferConnector", "TransferRequest"]


def engine_placement(vllm_config: VllmConfig, harness: HarnessSettings, is_producer: bool) -> Placement:
    """This worker's rank and both engines' TP degrees (the other engine's from the harness), and
    the model's KV heads (1 for MLA's latent)."""
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

    tp = get_tensor_model_parallel_world_size()
    p, d = harness.prefill_tp, harness.decode_tp
    side, said = ("prefill", p) if is_producer else ("decode", d)
    if said != tp:
        raise RuntimeError(f"the harness says the {side} engine has tensor_parallel_size={said}, this engine has {tp}")
    model = vllm_config.model_config
    # MLA's latent is one unit every worker holds whole (its config's num_key_value_heads are the query heads')
    heads = 1 if model.use_mla else model.get_total_num_kv_heads()
    return Placement(get_tensor_model_parallel_rank(), p, d, heads, is_producer)


class TransferConnector(KVConnectorBase_V1, SupportsHMA):
    """Base of every strategy. Subclasses implement `send` and `receive`. A hybrid model's KV
    (kv_groups.py: vLLM's hybrid allocator, which it keeps on for a connector that SupportsHMA)
    reaches a strategy as pools of pages in place of layers."""

    Params = NoParams  # the strategy's own parameters (strategy.params): a frozen dataclass
    codec: str | None = None  # a lossy strategy's format (codecs.FORMATS); None: the KV moves bit for bit
    # whether it moves a hybrid model's pages: not one streaming layer by layer or chunk by chunk
    # (a page pool is no layer, and a recurrent state is whole only at the prompt's end)
    moves_hybrid: bool = True

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        cfg = self._kv_transfer_config
        config = ConnectorConfig.parse(cfg.kv_connector_extra_config, self.Params)
        self.is_producer = cfg.kv_role == "kv_producer"
        self.params = config.strategy
        self.block_size = vllm_config.cache_config.block_size
        self.groups = KVGroups.of(kv_cache_config, self.block_size)
        # one part per role, as vLLM's own connectors split them
        self.scheduler = self.worker = None
        if role == KVConnectorRole.SCHEDULER:
            self.scheduler = RequestTracker(self.is_producer, self.block_size,
                                            RecordWriters(config.harness.stats_path, compute_path),
                                            timeout_s=config.harness.timeout_s, groups=self.groups)
        else:
            self.worker = TransferWorker(type(self).__name__, self.is_producer, config.harness, config.transport)

    # ------------------------------------------------------------ the strategy's API
    def prepare_send(self, req: TransferRequest) -> None:
        """Optional, prefill worker: runs before the forward pass that computes req's KV."""

    def send(self, req: TransferRequest) -> None:
        raise NotImplementedError

    def receive(self, req: TransferRequest) -> None:
        raise NotImplementedError

    @property
    def kv(self) -> KVBlocks:
        return self.worker.kv

    @property
    def n_layers(self) -> int:
        return self.worker.kv.n_layers

    def gather_plan(self, block_ids: Sequence[int], layers: Sequence[int] | None = None) -> Callable[[], torch.Tensor]:
        layers = range(self.n_layers) if layers is None else layers
        buf = self.worker.send_side.alloc(len(block_ids), len(layers))
        copy = self.kv.gather_plan(block_ids, buf, layers)

        def run() -> torch.Tensor:
            copy()
            return buf
        return run

    def gather(self, block_ids: Sequence[int], layers: Sequence[int] | None = None) -> torch.Tensor:
        return self.gather_plan(block_ids, layers)()

    def encode_plan(self, req: TransferRequest) -> Callable[[], torch.Tensor]:
        codec = self.worker.codec
        out = self.worker.channel.alloc(codec.nbytes(self.n_layers, len(req.block_ids)))
        encode = codec.encode_plan(req.block_ids, out)

        def run() -> torch.Tensor:
            timer = DeviceTimer(self.kv.device)
            encode()
            req.progress.codec_ms = timer.stop()
            return out
        return run

    def decode_into(self, req: TransferRequest, payload: torch.Tensor) -> None:
        self.worker.receive_side.decode_into(req, payload)

    def scatter(self, req: TransferRequest, payload: torch.Tensor, layers: Sequence[int] | None = None,
                first_block: int = 0) -> None:
        layers = range(self.n_layers) if layers is None else layers
        kv = self.kv
        src = kv.view(payload, len(layers))
        end = first_block + src.shape[1 + kv.block_dim]
        lo = max(req.skip_blocks, first_block)  # blocks before skip_blocks came from our prefix cache
        if lo < end:
            kv.scatter(req.block_ids[lo:end], src.narrow(1 + kv.block_dim, lo - first_block, end - lo), layers)

    def post(self, req: TransferRequest, payload: torch.Tensor, index: int = 0, count: int = 1, **meta) -> None:
        self.worker.send_side.post(req, payload, index, count, **meta)

    def collect(self, req: TransferRequest, index: int | None = None) -> list[Message]:
        return self.worker.receive_side.collect(req, index)

    def this_step(self) -> TransferMetadata:
        meta = self._get_connector_metadata()
        assert isinstance(meta, TransferMetadata)
        return meta

    def begin_send(self, req: TransferRequest, streaming: bool = False) -> None:
        self.worker.send_side.begin_send(req, streaming)

    def end_send(self, req: TransferRequest) -> None:
        self.worker.send_side.end_send(req)

    def begin_receive(self, req: TransferRequest) -> None:
        self.worker.receive_side.begin_receive(req)

    def end_receive(self, req: TransferRequest) -> None:
        self.worker.receive_side.end_receive(req)

    # ------------------------------------------------------------ vLLM: scheduler side
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        return self.scheduler.matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        self.scheduler.allocated(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        return self.scheduler.step_metadata(scheduler_output)

    def request_finished(self, request, block_ids):
        self.scheduler.finished(request)
        return False, None

    def request_finished_all_groups(self, request, block_ids):
        return self.request_finished(request, block_ids)

    def on_new_request(self, request) -> None:
        self.scheduler.new_request(request)

    # ------------------------------------------------------------ vLLM: worker side
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        num_blocks = self._kv_cache_config.num_blocks
        if self.groups.hybrid:
            if self.codec is not None or not self.moves_hybrid:
                raise NotImplementedError(f"{type(self).__name__} does not move a hybrid model's KV")
            kv_caches = page_pools(kv_caches, num_blocks)
        self.worker.register(kv_caches, num_blocks, self.block_size, self._placement())
        if self.codec is not None:
            model = self._vllm_config.model_config
            # MLA's "head" is its latent and rotary key side by side (576 values on DeepSeek): groups of the
            # rotary key's width keep it under a scale of its own (int8's error on tiny-mla, docs/strategies.md)
            head_size = model.hf_text_config.qk_rope_head_dim if model.use_mla else model.get_head_size()
            self.worker.use_codec(Codec(self.codec, self.params).attach(self.kv, self.block_size, head_size))

    def _placement(self) -> Placement:
        return engine_placement(self._vllm_config, self.worker.harness, self.is_producer)

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        """Before every step's forward pass (start_load_kv may come after it: vLLM 0.32 starts
        a step without synchronous loads after launching its forward pass)."""
        super().bind_connector_metadata(connector_metadata)
        if not isinstance(connector_metadata, TransferMetadata):
            return
        if self.is_producer:
            # with several decode instances, a request that names none is not sent (its record says why)
            send_side = self.worker.send_side
            connector_metadata.sends = send_side.routable(connector_metadata.sends)
            connector_metadata.chunks = send_side.routable(connector_metadata.chunks, record=False)
            if send_side.silent:  # the strategy sees none of them: their records say nothing was sent
                connector_metadata.recorded_only, connector_metadata.sends = connector_metadata.sends, []
                connector_metadata.chunks = []
            for req in connector_metadata.sends:
                send_side.route(req)  # what prepare_send allocates is in its decode instance's space
                self.prepare_send(req)
        else:
            self.worker.receive_side.take_step(connector_metadata)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """Decode side, early submission: load the parked requests whose KV has arrived (in a
        step with nothing to compute, after waiting a little for one), and let vLLM schedule them."""
        if self.is_producer or not self.has_connector_metadata():
            return None, None
        receive_side = self.worker.receive_side
        for req in receive_side.arrived(idle=self.this_step().idle):
            self._load(req)
        return None, receive_side.finished_receiving() or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        return set() if self.worker is None or self.is_producer else self.worker.receive_side.load_errors()

    def start_load_kv(self, forward_context, **kwargs) -> None:
        for req in self.this_step().loads:
            self._load(req)

    def _load(self, req: TransferRequest) -> None:
        self.begin_receive(req)
        try:
            self.receive(req)
        except TransferFault as e:  # arrived broken (truncated, or not what was sent)
            self.worker.receive_side.fail_receive(req, str(e))
            return
        self.end_receive(req)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata, **kwargs) -> None:
        return

    def wait_for_save(self) -> None:
        if not self.has_connector_metadata():
            return
        for req in self.this_step().sends:
            if req.progress.clock is None:  # not already sending from inside the forward pass
                self.begin_send(req)
                self.send(req)
            self.end_send(req)
        for req in self.this_step().recorded_only:  # after the forward pass: the digests are of its KV
            self.begin_send(req)
            self.end_send(req)

    # ------------------------------------------------------------ counters in /metrics (connector_stats.py)
    def get_kv_connector_stats(self) -> TransferCounts | None:
        return None if self.worker is None else self.worker.tally.take()

    @classmethod
    def build_kv_connector_stats(cls, data: dict | None = None) -> TransferCounts:
        return TransferCounts(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues) -> TransferPromMetrics:
        return TransferPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def shutdown(self):
        if self.worker is not None:
            self.worker.close()
