"""What every transfer strategy shares: a vLLM KV connector (`KVConnectorBase_V1`).

A strategy subclasses `TransferConnector` and writes two methods:

    send(req)     prefill worker: move the request's blocks into `self.channel` (with `self.post`)
    receive(req)  decode worker: take them out (with `self.collect`) and write them into
                  `req.block_ids[req.skip_blocks:]` of this engine's KV cache

and, to stream layer by layer, may also use vLLM's `save_kv_layer` / `wait_for_layer_load`
hooks. The base does the rest: which blocks a request owns on each side (from vLLM's
scheduler), the channel between the two workers, timing, byte and message counts, per-block
digests and a stats record per transfer, which the harness joins with its own records.

How a request flows (the harness drives it):
  1. The prefill engine gets the prompt with max_tokens=1 and kv_transfer_params
     {"transfer_id": id}. When the scheduler has computed the whole prompt it puts a
     `TransferRequest` with the request's block ids into the step's metadata; the worker sends
     after the forward pass (`wait_for_save`) unless the strategy streams layers.
  2. The decode engine gets the same prompt and transfer id. Its scheduler asks us how many
     prompt tokens come from outside (`get_num_new_matched_tokens`): all but the last, which
     vLLM must compute itself to produce logits. It allocates blocks; we pass their ids to the
     worker, which scatters the received blocks into them before the forward pass.
Both sides move the blocks holding prompt tokens [0, prompt_len - 1), so their counts agree.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from transfer_strategies.transport import Message, open_channel

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import SchedulerOutput

LAYOUT_ID = "__layout__"


@dataclass
class TransferRequest:
    """One request's KV as one engine sees it."""

    transfer_id: str
    req_id: str
    block_ids: list[int]  # this engine's blocks holding prompt tokens [0, num_tokens)
    num_tokens: int  # prompt_len - 1: the tokens whose KV moves
    skip_blocks: int = 0  # decode only: leading blocks this engine already has (prefix cache)
    # filled in by the worker while it moves the request
    t_start: float | None = 0.0
    streaming: bool = False  # sending from inside the forward pass (begin_send(sync=False))
    gpu_start: Any = None  # a CUDA event at t_start
    prepared: Any = None  # whatever the strategy's prepare_send left for its send
    bytes: int = 0
    messages: int = 0
    received: list[Message] = field(default_factory=list)


@dataclass
class TransferMetadata(KVConnectorMetadata):
    sends: list[TransferRequest] = field(default_factory=list)
    loads: list[TransferRequest] = field(default_factory=list)


def blocks_for(num_tokens: int, block_size: int) -> int:
    return math.ceil(num_tokens / block_size) if num_tokens > 0 else 0


def in_memory_order(t: torch.Tensor) -> torch.Tensor:
    """A view of t with its axes in memory order (largest stride first). Some GPU backends
    allocate the KV cache in one axis order and hand it out permuted; in memory order every
    per-block slice is contiguous, and both engines agree on the bytes of a block."""
    order = sorted(range(t.dim()), key=lambda d: -t.stride(d))
    view = t.permute(order)
    return view if view.is_contiguous() else t


def block_runs(block_ids: list[int]) -> list[tuple[int, int]]:
    """Consecutive block ids as (first, count) runs: [4, 5, 6, 9] -> [(4, 3), (9, 1)]."""
    runs: list[tuple[int, int]] = []
    for b in block_ids:
        if runs and b == runs[-1][0] + runs[-1][1]:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((b, 1))
    return runs


def _starts(runs: list[tuple[int, int]], dst: bool) -> list[tuple[int, int, int]]:
    """(dst start, src start, count) per run, the runs being on the dst side or the src side
    and the other side holding the blocks packed in order."""
    out, at = [], 0
    for first, n in runs:
        out.append((first, at, n) if dst else (at, first, n))
        at += n
    return out


def _copy_runs(dst: torch.Tensor, src: torch.Tensor, pairs: list[tuple[int, int, int]], dim: int) -> None:
    # Split off the axes before the block axis (K/V in some GPU layouts) so that every copy is
    # one contiguous range: a plain memcpy, also between GPUs.
    for lead in itertools.product(*(range(n) for n in dst.shape[:dim])):
        d, s = dst[lead], src[lead]
        for d0, s0, n in pairs:
            d.narrow(0, d0, n).copy_(s.narrow(0, s0, n))


_SMALL_CPU_COPY = 4 << 20


def _few(runs: list, block_ids: list) -> bool:
    # A slice copy per run beats one indexed copy when runs are long; with many short runs the
    # launches (on a GPU) cost more than the indexed kernel's slower element loop.
    return len(runs) <= max(4, len(block_ids) // 8)


class TransferConnector(KVConnectorBase_V1):
    """Base of every strategy. Subclasses implement `send` and `receive`."""

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        cfg = self._kv_transfer_config
        self.is_producer = cfg.kv_role == "kv_producer"
        self.params: dict[str, Any] = dict(cfg.kv_connector_extra_config or {})
        self.block_size = vllm_config.cache_config.block_size
        self.verify = bool(self.params.get("verify", True))
        self.corrupt = bool(self.params.get("corrupt", False))  # negative control, see `scatter`
        # scheduler-side state
        self._sends: dict[str, TransferRequest] = {}
        self._local_hits: dict[str, int] = {}
        self._loads: list[TransferRequest] = []
        # worker-side state, set in register_kv_caches
        self.channel = None
        self.kv_layers: list[torch.Tensor] = []
        self.layer_names: list[str] = []
        self.block_dim = 0

    # ------------------------------------------------------------------ scheduler side
    @staticmethod
    def _transfer_id(request) -> str | None:
        params = request.kv_transfer_params or {}
        return params.get("transfer_id")

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        tid = self._transfer_id(request)
        if self.is_producer or tid is None:
            return 0, False
        self._local_hits[request.request_id] = num_computed_tokens
        return max(len(request.prompt_token_ids) - 1 - num_computed_tokens, 0), False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        tid = self._transfer_id(request)
        if tid is None:
            return
        n_tok = len(request.prompt_token_ids) - 1
        if self.is_producer:
            self._sends[request.request_id] = TransferRequest(tid, request.request_id, [], n_tok)
            return
        # decode: every request with a transfer id takes its message, even when nothing is
        # loaded (all blocks were already cached here), so the sender's KV is checked and freed.
        block_ids = list(self._single_group(blocks.get_block_ids()))[: blocks_for(n_tok, self.block_size)]
        skip = self._local_hits.pop(request.request_id, 0) // self.block_size
        self._loads.append(TransferRequest(tid, request.request_id, block_ids, n_tok, skip))

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        meta = TransferMetadata(loads=self._loads)
        self._loads = []
        if not self.is_producer:
            return meta
        progress: list[tuple[str, int]] = []
        for new in scheduler_output.scheduled_new_reqs:
            if new.req_id in self._sends:
                self._sends[new.req_id].block_ids = list(self._single_group(new.block_ids))
                progress.append((new.req_id, new.num_computed_tokens))
        cached = scheduler_output.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            if rid in self._sends:
                new_blocks = cached.new_block_ids[i]
                if new_blocks is not None:
                    blocks = list(self._single_group(new_blocks))
                    resumed = rid in getattr(cached, "resumed_req_ids", ())  # after preemption: all blocks anew
                    self._sends[rid].block_ids = blocks if resumed else self._sends[rid].block_ids + blocks
                progress.append((rid, cached.num_computed_tokens[i]))
        for rid, computed in progress:
            # send once the step that computes the prompt's last token has run (chunked prefill)
            prompt_len = self._sends[rid].num_tokens + 1
            if computed + scheduler_output.num_scheduled_tokens.get(rid, 0) >= prompt_len:
                req = self._sends.pop(rid)
                req.block_ids = req.block_ids[: blocks_for(req.num_tokens, self.block_size)]
                meta.sends.append(req)
        return meta

    def request_finished(self, request, block_ids):
        self._sends.pop(request.request_id, None)
        return False, None

    @staticmethod
    def _single_group(block_ids):
        if len(block_ids) != 1:
            raise NotImplementedError("transfer strategies support one KV cache group (no hybrid models)")
        return block_ids[0]

    # ------------------------------------------------------------------ worker side
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        self.layer_names = list(kv_caches)
        for name in self.layer_names:
            if not isinstance(kv_caches[name], torch.Tensor):
                raise NotImplementedError(f"KV cache of type {type(kv_caches[name]).__name__}: expected one tensor per layer")
        self.kv_layers = [in_memory_order(kv_caches[n]) for n in self.layer_names]
        num_blocks = self._kv_cache_config.num_blocks
        # The attention backend decides the layout; the block axis is the one sized num_blocks.
        dims = [d for d, s in enumerate(self.kv_layers[0].shape) if s == num_blocks]
        if not dims:
            raise RuntimeError(f"no axis of size num_blocks={num_blocks} in KV shape {tuple(self.kv_layers[0].shape)}")
        self.block_dim = dims[0]
        self.device = self.kv_layers[0].device
        self._set_pieces()
        rank = 0 if self.is_producer else 1
        self.channel = open_channel(rank, self.params.get("host", "127.0.0.1"), self.params["rendezvous"],
                                    self.device, float(self.params.get("timeout_s", 300)), self.params)
        self._exchange_layout()

    def _set_pieces(self) -> None:
        # Each layer's KV split along the axes before the block axis (K/V on some GPU backends):
        # contiguous pieces with blocks first, in the order of `layer_shape`'s elements.
        self._pieces = [t[lead] for t in self.kv_layers
                        for lead in itertools.product(*(range(n) for n in t.shape[:self.block_dim]))]
        self._batched = all(p.is_contiguous() for p in self._pieces)

    def _layout(self) -> dict:
        shape = list(self.kv_layers[0].shape)
        shape[self.block_dim] = -1
        return {"layers": len(self.kv_layers), "block_shape": shape, "block_dim": self.block_dim,
                "dtype": str(self.kv_layers[0].dtype), "block_size": self.block_size}

    def _exchange_layout(self) -> None:
        """Both engines must agree on layers, per-block shape and dtype (not on num_blocks)."""
        mine = self._layout()
        if self.is_producer:
            self.channel.send(LAYOUT_ID, 0, 1, torch.empty(0, dtype=torch.uint8), layout=mine)
            return
        theirs = self.channel.wait(LAYOUT_ID)[0].meta["layout"]
        self.channel.release(LAYOUT_ID)
        if theirs != mine:
            raise RuntimeError(f"prefill and decode KV layouts differ: prefill {theirs}, decode {mine}")

    def block_bytes(self) -> int:
        """Bytes of one block in one layer."""
        t = self.kv_layers[0]
        return t.numel() // t.shape[self.block_dim] * t.element_size()

    def gather(self, layer: int, block_ids: list[int], out: torch.Tensor | None = None) -> torch.Tensor:
        """This engine's blocks `block_ids` of one layer, in `layer_shape(len(block_ids))`. `out` may
        live on another device (a peer GPU's staging buffer): the copy then crosses the link."""
        src = self.kv_layers[layer]
        if out is None:
            out = torch.empty(self.layer_shape(len(block_ids)), dtype=src.dtype, device=src.device)
        runs = block_runs(block_ids)
        if _few(runs, block_ids):  # mostly consecutive blocks: one contiguous copy per run, at copy speed
            _copy_runs(out, src, _starts(runs, dst=False), self.block_dim)
            return out
        idx = torch.tensor(block_ids, dtype=torch.long, device=src.device)
        if out.device == src.device:
            return torch.index_select(src, self.block_dim, idx, out=out)
        return out.copy_(torch.index_select(src, self.block_dim, idx))

    def gather_layers(self, block_ids: list[int], out: torch.Tensor) -> torch.Tensor:
        """Blocks `block_ids` of every layer into out, [layers, *layer_shape(len(block_ids))]."""
        self.gather_plan(block_ids, out)()
        return out

    def gather_plan(self, block_ids: list[int], out: torch.Tensor):
        """`gather_layers` as a function to call later: the slicing is done now (before the
        forward pass, in `prepare_send`), the copying when called. Consecutive blocks go in one
        batched copy for all layers: launching a copy per layer and K/V costs more than the
        copying on a GPU (64 launches took 0.96 ms, the bytes 0.53)."""
        if not block_ids:
            return lambda: None
        runs = block_runs(block_ids)
        if self._batched and out.device == self.device and _few(runs, block_ids):
            rest = self.kv_layers[0].shape[self.block_dim + 1:]
            pieces = [p.narrow(0, first, n) for p in self._pieces for first, n in runs]
            flat = out.view(-1, *rest)
            if self.device.type == "cpu" and out.nbytes < _SMALL_CPU_COPY:
                # One memcpy per piece on this thread: waking OpenMP's sleeping threads for a
                # parallel copy cost more than it saved below a few MiB (1 MiB: 0.29 vs 0.50 ms).
                srcs = [x.view(torch.uint8).numpy() for x in pieces]
                dst = flat.view(torch.uint8).numpy()
                return lambda: np.concatenate(srcs, out=dst)
            return lambda: torch.cat(pieces, out=flat)
        return lambda: [self.gather(layer, block_ids, out=out[layer]) for layer in range(len(self.kv_layers))]

    def scatter_layers(self, req: TransferRequest, layers: torch.Tensor) -> None:
        """The inverse of `gather_layers`: every layer's received blocks into this engine's
        blocks, the prefix-cache hits left alone."""
        ids = req.block_ids[req.skip_blocks:]
        runs = block_runs(ids)
        if self._batched and ids and layers.device == self.device and _few(runs, ids) and not self.corrupt:
            rest = self.kv_layers[0].shape[self.block_dim + 1:]
            src = layers.narrow(1 + self.block_dim, req.skip_blocks, len(ids)).reshape(-1, *rest)
            sizes = [n for _ in self._pieces for _, n in runs]
            torch.split_with_sizes_copy(src, sizes, out=[p.narrow(0, first, n) for p in self._pieces
                                                          for first, n in runs])
            return
        for layer in range(len(self.kv_layers)):
            self.scatter(req, layer, layers[layer])

    def gather_to_send(self, layer: int, block_ids: list[int]) -> torch.Tensor:
        """`gather` straight into the channel's send space (no copy between gather and send)."""
        return self.gather(layer, block_ids, out=self.empty(n_blocks=len(block_ids)))

    def scatter(self, req: TransferRequest, layer: int, src: torch.Tensor, start: int = 0) -> None:
        """Write received blocks [start, start + k) of a request (k = src's block count) into this
        engine's blocks, leaving alone those it already had (prefix cache hits)."""
        k = src.shape[self.block_dim]
        lo = max(req.skip_blocks, start)
        if lo >= start + k:
            return
        src = src.narrow(self.block_dim, lo - start, start + k - lo)
        if self.corrupt and layer == 0 and lo == 0:
            src = src.clone()  # negative control: this request's first block arrives with its signs flipped
            src.narrow(self.block_dim, 0, 1).neg_()
        dst_ids = req.block_ids[lo:start + k]
        dst = self.kv_layers[layer]
        runs = block_runs(dst_ids)
        if _few(runs, dst_ids):
            _copy_runs(dst, src, _starts(runs, dst=True), self.block_dim)
            return
        idx = torch.tensor(dst_ids, dtype=torch.long, device=self.device)
        dst.index_copy_(self.block_dim, idx, src.to(self.device))

    def layer_shape(self, n_blocks: int) -> list[int]:
        """Shape of n_blocks blocks of one layer, as `gather` returns them."""
        shape = list(self.kv_layers[0].shape)
        shape[self.block_dim] = n_blocks
        return shape

    def empty(self, *lead: int, n_blocks: int) -> torch.Tensor:
        """A send buffer of [*lead, *layer_shape(n_blocks)] in the KV dtype, allocated by the channel
        (on CUDA, in the staging buffer the receiver reads from: no extra copy)."""
        shape = (*lead, *self.layer_shape(n_blocks))
        dtype = self.kv_layers[0].dtype
        nbytes = math.prod(shape) * dtype.itemsize
        return self.channel.alloc(nbytes).view(dtype).view(shape)

    def view_payload(self, payload: torch.Tensor, *lead: int, n_blocks: int) -> torch.Tensor:
        """View received bytes as [*lead, *layer_shape(n_blocks)] in the KV dtype."""
        return payload.view(self.kv_layers[0].dtype).view(*lead, *self.layer_shape(n_blocks))

    def post(self, req: TransferRequest, index: int, count: int, payload: torch.Tensor) -> None:
        """Send message `index` of `count` of this request's transfer."""
        self._start_clock(req)
        # The last message's doorbell rings from this thread (no hand-over); earlier ones, and all
        # of a streaming send, from the channel's thread so that launching the next copy goes on.
        background = req.streaming or index < count - 1
        req.bytes += self.channel.send(req.transfer_id, index, count, payload, background=background,
                                       t0=req.t_start)
        req.messages += 1

    def collect(self, req: TransferRequest, index: int | None = None) -> list[Message]:
        """Wait for message `index` (default: all messages) of this request's transfer."""
        msgs = self.channel.wait(req.transfer_id, index)
        req.received.extend(msgs)
        return msgs

    # strategy hooks -------------------------------------------------------------
    def prepare_send(self, req: TransferRequest) -> None:
        """Optional, prefill worker: runs before the forward pass that computes req's KV, so
        work that needs no KV (allocating the send buffer, planning copies) is off the clock."""
        return

    def send(self, req: TransferRequest) -> None:
        raise NotImplementedError

    def receive(self, req: TransferRequest) -> None:
        raise NotImplementedError

    # vLLM hooks -----------------------------------------------------------------
    def _meta(self) -> TransferMetadata:
        meta = self._get_connector_metadata()
        assert isinstance(meta, TransferMetadata)
        return meta

    def start_load_kv(self, forward_context, **kwargs) -> None:
        for req in self._meta().sends:
            self.prepare_send(req)
        for req in self._meta().loads:
            self.begin_receive(req)
            self.receive(req)
            self.end_receive(req)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata, **kwargs) -> None:
        return

    def wait_for_save(self) -> None:
        if not self.has_connector_metadata():
            return
        for req in self._meta().sends:
            if req.prepared is None:  # no start_load_kv ran before this step's forward pass
                self.prepare_send(req)
            self.begin_send(req)
            self.send(req)
            self.end_send(req)

    # timing, counting, digests ---------------------------------------------------
    def begin_send(self, req: TransferRequest, sync: bool = True) -> None:
        """Start the clock once the forward pass has computed this KV (sync=True, after the forward
        pass), or now (sync=False: a streaming strategy inside the forward pass, not to stall it).
        On a GPU the host is usually ahead of the forward pass: the copies are then launched at
        once, queued behind it on the stream, and the clock starts when the GPU reaches them
        (an event here, waited for at the first `post`), so launching them is not on the clock."""
        req.streaming = not sync
        req.t_start = time.monotonic()
        if self.device.type == "cuda":
            req.gpu_start = torch.cuda.Event(enable_timing=True)
            req.gpu_start.record()
            if sync:
                req.t_start = None

    @staticmethod
    def _start_clock(req: TransferRequest) -> None:
        """See begin_send: on a GPU the clock starts when the GPU reaches the queued copies."""
        if req.t_start is None:
            req.gpu_start.synchronize()
            req.t_start = time.monotonic()

    def end_send(self, req: TransferRequest) -> None:
        self._start_clock(req)  # nothing was posted
        self.channel.flush()
        self._sync()
        fields = {"send_ms": (time.monotonic() - req.t_start) * 1e3}
        written = self.channel.last_written
        if req.gpu_start is not None and written is not None:
            # t_start -> the last payload written, on the GPU's clock: the copies plus any time
            # the GPU waited for them to be launched, without the host's wait for the GPU
            fields["gpu_ms"] = req.gpu_start.elapsed_time(written)
        self.record(req, "send", bytes=req.bytes, messages=req.messages, **fields)

    def begin_receive(self, req: TransferRequest) -> None:
        req.t_start = time.monotonic()

    def end_receive(self, req: TransferRequest) -> None:
        self._sync()
        t_end = time.monotonic()
        self.channel.release(req.transfer_id)
        msgs = req.received
        sent_at = msgs[0].meta.get("t0", req.t_start) if msgs else req.t_start
        delivered = max((m.delivered for m in msgs), default=req.t_start)
        arrived = max((m.arrived for m in msgs), default=req.t_start)
        self.record(req, "receive", bytes=sum(m.payload.numel() for m in msgs), messages=len(msgs),
                    transfer_ms=(delivered - sent_at) * 1e3,  # sender starts gathering -> last byte in our memory
                    notify_ms=(arrived - delivered) * 1e3,  # -> this worker has been told (doorbell latency)
                    load_ms=(t_end - req.t_start) * 1e3,  # decode step blocked on KV (wait + scatter)
                    ready_ms=(t_end - sent_at) * 1e3)  # sender starts -> KV in this engine's blocks

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def block_digests(self, block_ids: list[int]) -> list[str]:
        """One 64-bit checksum per block over that block's bytes in every layer, computed on the
        KV device straight from this engine's blocks (not through a strategy's copy code): the
        bytes read as 32-bit words, each times an odd weight that depends on its position and
        layer (mod 2^32: multiplying by an odd number loses no bit), summed in int64. Any
        changed bit, and any block or words swapped, changes the sum. One read of the KV and one
        pass over the products: the digest sits on the critical path of both engines' steps."""
        if not block_ids:
            return []
        total = torch.zeros(len(block_ids), dtype=torch.int64, device=self.device)
        for k, words in enumerate(self._block_words(block_ids)):
            for at, w in words:  # at: where these blocks sit in block_ids; w: [blocks, words] int32
                h = torch.mul(w, self._digest_weights(w.shape[1], k)).sum(dim=1, dtype=torch.int64)
                total[at:at + w.shape[0]] += h
        return [format(int(x) & (2**64 - 1), "016x") for x in total.cpu().tolist()]

    def _block_words(self, block_ids: list[int]):
        """Per piece of KV (a layer, or a layer's K or V), the requested blocks as int32 words,
        [blocks, words per block]: views of the cache, block run by block run, where pieces are
        contiguous; else gathered one layer at a time."""
        if self._batched:
            runs = _starts(block_runs(block_ids), dst=False)  # (position in block_ids, first block, count)
            for p in self._pieces:
                yield [(at, p.narrow(0, first, n).reshape(n, -1).view(torch.int32)) for at, first, n in runs]
            return
        for layer in range(len(self.kv_layers)):
            blocks = self.gather(layer, block_ids).movedim(self.block_dim, 0).contiguous()
            yield [(0, blocks.view(len(block_ids), -1).view(torch.int32))]

    def _digest_weights(self, n: int, piece: int) -> torch.Tensor:
        key = (n, piece)
        cache = self.__dict__.setdefault("_weights", {})
        if key not in cache:
            i = torch.arange(n, dtype=torch.int64, device=self.device)
            w = ((i * 2654435761 + (piece + 1) * 40503) % (2**31)) | 1  # odd, below 2^31
            cache[key] = w.to(torch.int32)
        return cache[key]

    def record(self, req: TransferRequest, side: str, **fields) -> None:
        row = {"transfer_id": req.transfer_id, "side": side, "strategy": type(self).__name__,
               "blocks": len(req.block_ids), "skip_blocks": req.skip_blocks, "tokens": req.num_tokens,
               "kv_cache_blocks": self._kv_cache_config.num_blocks,
               "kv_cache_bytes": self.block_bytes() * len(self.kv_layers) * self._kv_cache_config.num_blocks,
               **fields}
        if self.verify:
            t0 = time.monotonic()
            row["digests"] = self.block_digests(req.block_ids)
            row["digest_ms"] = (time.monotonic() - t0) * 1e3
        path = self.params.get("stats_path")
        if path:
            with open(path, "a") as f:
                f.write(json.dumps(row) + "\n")

    def shutdown(self):
        if self.channel is not None:
            self.channel.close()

