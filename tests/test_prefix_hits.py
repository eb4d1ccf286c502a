"""Digests judge exactly what a transfer wrote: a block the decode engine took from its own prefix
cache is not the transfer's, and may hold a token the decode engine computed itself in other
bits than the prefill's (the last prompt token of an earlier request that ended on the block's
last slot: seen on an H200, and on CPU between TP degrees). Built here at the worker level with
real KV caches, the real copy engine and the real digests."""

import torch

from harness.records.transfer_records import digests_agree
from transfer_strategies.negative_control import corrupt_received
from transfer_strategies.records import TransferRecord
from transfer_strategies.scheduler import TransferRequest
from transfer_strategies.tp import Placement
from transfer_strategies.worker import TransferWorker

NUM_BLOCKS, HEADS, BLOCK, DIM, LAYERS = 16, 2, 4, 8, 3


def worker(producer: bool, cache: dict, place: Placement | None = None) -> TransferWorker:
    w = TransferWorker("FusedConnector", producer)
    w.attach(cache, NUM_BLOCKS, place)
    return w


def cache(fill, heads: int = HEADS) -> dict:
    return {f"layer.{i}": fill(NUM_BLOCKS, heads, BLOCK, DIM) for i in range(LAYERS)}  # the CPU backend's layout


def record(w: TransferWorker, req: TransferRequest, rank: int = 0) -> TransferRecord:
    return TransferRecord(transfer_id=req.transfer_id, side="send" if w.is_producer else "receive", strategy="x",
                          blocks=len(req.block_ids), skip_blocks=req.skip_blocks, tokens=req.num_tokens,
                          kv_cache_blocks=NUM_BLOCKS, kv_cache_bytes=0, bytes=0, messages=1, rank=rank,
                          digests=w.recorder.digests(w.recorder.transfer_block_ids(req)))


def rewrite_last_slot(w: TransferWorker, block: int) -> None:
    """The decode engine computes the earlier prompt's last token into the block's last slot
    itself: the same value but for the last bit."""
    for layer in w.kv.layers:
        slot = layer[block, :, BLOCK - 1]
        slot.copy_(torch.nextafter(slot, torch.full_like(slot, float("inf"))))


def transfer(pre: TransferWorker, send: TransferRequest, dec: TransferWorker, recv: TransferRequest) -> None:
    """What a strategy does: the sender's blocks gathered, scattered into the receiver's blocks
    past its prefix-cache hits (base.TransferConnector.scatter)."""
    layers = range(LAYERS)
    buf = torch.empty(LAYERS, *pre.kv.layer_shape(len(send.block_ids)))
    pre.kv.gather(send.block_ids, buf, layers)
    dec.kv.scatter(recv.written_block_ids, buf[:, recv.skip_blocks:], layers)


def test_a_block_from_the_decode_engines_prefix_cache_is_not_judged_and_a_written_one_is():
    pre, dec = worker(True, cache(torch.randn)), worker(False, cache(torch.zeros))
    # An earlier request of BLOCK tokens: its block went 3 -> 7, then the decode engine computed
    # the prompt's last token into slot BLOCK - 1 itself and cached the block.
    first = TransferRequest("t0", "r0", [3], num_tokens=BLOCK - 1), TransferRequest("t0", "r0", [7], BLOCK - 1)
    transfer(pre, first[0], dec, first[1])
    assert digests_agree([record(pre, first[0])], [record(dec, first[1])], 1, 1) is True
    rewrite_last_slot(dec, 7)
    # A prompt extending it: block 3 (prefill's cache) / 7 (decode's cache), then a new block.
    send = TransferRequest("t1", "r1", [3, 5], num_tokens=2 * BLOCK)
    recv = TransferRequest("t1", "r1", [7, 9], num_tokens=2 * BLOCK, skip_blocks=1)
    transfer(pre, send, dec, recv)
    assert dec.recorder.digests([7, 9]) != pre.recorder.digests([3, 5])  # every block judged: a correct transfer failed
    sent, received = record(pre, send), record(dec, recv)
    assert len(received.digests["all"]) == 1 and received.skip_blocks == 1
    assert digests_agree([sent], [received], 1, 1) is True
    corrupt_received(dec.kv, recv)  # the negative control damages the block the transfer wrote
    assert digests_agree([sent], [record(dec, recv)], 1, 1) is False
    # every block in the decode engine's prefix cache: nothing written, nothing to judge
    cached = TransferRequest("t2", "r2", [7], num_tokens=BLOCK, skip_blocks=1)
    assert digests_agree([record(pre, TransferRequest("t2", "r2", [3], BLOCK))], [record(dec, cached)], 1, 1) is None


def test_the_same_holds_per_channel_when_two_prefill_workers_feed_one_decode_worker():
    """Prefill TP 2 -> decode TP 1: each prefill worker's head judged against the decode
    worker's, past the decode engine's prefix-cache hits."""
    full = cache(torch.randn)
    pres = [worker(True, {n: t[:, h:h + 1].clone() for n, t in full.items()}, Placement(h, 2, 1, HEADS, True))
            for h in range(HEADS)]
    dec = worker(False, cache(torch.zeros), Placement(0, 2, 1, HEADS, False))
    send = TransferRequest("t", "r", [3, 5], num_tokens=2 * BLOCK)
    recv = TransferRequest("t", "r", [7, 9], num_tokens=2 * BLOCK, skip_blocks=1)
    for n, t in zip(dec.kv.names, dec.kv.layers):
        t[[7, 9]] = full[n][[3, 5]]
    rewrite_last_slot(dec, 7)
    sent = [record(p, send, rank=r) for r, p in enumerate(pres)]
    assert set(sent[1].digests) == {"1"} and len(sent[1].digests["1"]) == 2
    assert digests_agree(sent, [record(dec, recv)], 2, 1) is True
    corrupt_received(dec.kv, recv)
    assert digests_agree(sent, [record(dec, recv)], 2, 1) is False
