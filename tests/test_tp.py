"""Tensor parallelism without engines: vLLM's head sharding, who sends which heads to whom, digests
that mean the same at any degree, merged records, and KV cut by heads and joined again through
real channels between processes."""

import multiprocessing as mp
import os

import pytest
import torch

from harness.records.transfer_records import digests_agree, merge_ranks
from tests.conftest import FULL, SLOW
from transfer_strategies.codecs import Codec
from transfer_strategies.connector_config import TransportSettings
from transfer_strategies.digests import BlockDigests
from transfer_strategies.head_shards import HeadJoinReceiver, ShardedSender, open_sharded, use_codec
from transfer_strategies.kv_blocks import KVBlocks
from transfer_strategies.records import TransferRecord
from transfer_strategies.tp import Placement, Share, degree_problem, heads_of, shares
from transfer_strategies.transport import open_channel, remove_leftovers
from transfer_strategies.transport.fan_out import FanOut

NB, T, C = 12, 5, 6  # blocks, tokens per block, elements of one head per token (no two alike)


def test_heads_are_sharded_and_replicated_as_vllm_does():
    assert [list(heads_of(r, 2, 8)) for r in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [list(heads_of(r, 4, 2)) for r in range(4)] == [[0], [0], [1], [1]]  # each head on 2 ranks
    assert list(heads_of(0, 1, 2)) == [0, 1]
    assert degree_problem(2, 2) is None and degree_problem(4, 2) is None and degree_problem(4, 8) is None
    assert "does not divide" in degree_problem(3, 2) and ">= 1" in degree_problem(0, 2)


@pytest.mark.parametrize("n_heads", [2, 8])
@pytest.mark.parametrize("p", [1, 2, 4])
@pytest.mark.parametrize("d", [1, 2, 4])
def test_every_decode_head_comes_once_from_a_prefill_worker_holding_it(p, d, n_heads):
    all_shares = shares(p, d, n_heads)
    for q in range(d):
        mine = [s for s in all_shares if s.decode_rank == q]
        got = [h for s in mine for h in s.heads]
        assert got == list(heads_of(q, d, n_heads))  # each head once, in order
        assert all(set(s.heads) <= set(heads_of(s.prefill_rank, p, n_heads)) for s in mine)
    if d >= p and n_heads >= d:  # decode's degree higher: each decode worker reads one prefill worker
        assert all(len([s for s in all_shares if s.decode_rank == q]) == 1 for q in range(d))
    place = Placement(0, p, d, n_heads, is_producer=False)
    for s in place.my_shares():
        slot, slots = place.slot(s)
        assert 0 <= slot < slots == len(place.my_shares())


def test_replicated_prefill_heads_are_read_from_different_replicas():
    # prefill TP 4 over 2 heads (each on 2 workers), decode TP 2: decode workers 0 and 1 want
    # heads 0 and 1; each from a replica of its own
    assert [(s.prefill_rank, s.decode_rank, list(s.heads)) for s in shares(4, 2, 2)] == [(0, 0, [0]), (3, 1, [1])]
    assert Placement(1, 4, 2, 2, is_producer=True).my_shares() == []  # a replica nobody reads


# --------------------------------------------------------------------------- digests per head
def caches(layout: str, heads: range, n_layers: int = 3, seed: int = 0) -> KVBlocks:
    """A KV cache holding `heads` of a 4-head model, in the CPU backend's layout ([blocks, heads,
    tokens, K and V]) or FlashAttention's NHD ([K/V, blocks, tokens, heads, head size])."""
    g = torch.Generator().manual_seed(seed)
    full = [torch.randn(NB, 4, T, C, generator=g) for _ in range(n_layers)]  # every head, one layout
    layers = {}
    for i, t in enumerate(full):
        mine = t[:, heads.start:heads.stop].contiguous()
        if layout == "nhd":
            mine = mine.view(NB, len(heads), T, 2, C // 2).permute(3, 0, 2, 1, 4).contiguous()
        layers[f"layer.{i}"] = mine
    return KVBlocks(layers, NB, n_heads=len(heads))


@pytest.mark.parametrize("layout", ["cpu", "nhd"])
def test_a_heads_digest_is_the_same_whatever_worker_holds_it(layout):
    ids = [3, 4, 5, 9, 0]
    whole = BlockDigests(caches(layout, range(4)))(ids)
    assert list(whole) == ["0", "1", "2", "3"] and len({v for vs in whole.values() for v in vs}) == 4 * len(ids)
    halves = {**BlockDigests(caches(layout, range(0, 2)), heads=range(0, 2))(ids),
              **BlockDigests(caches(layout, range(2, 4)), heads=range(2, 4))(ids)}
    assert halves == whole
    one = caches(layout, range(2, 3))
    assert one.head_dim_certain and BlockDigests(one, heads=[2])(ids) == {"2": whole["2"]}
    one.layers[1].view(-1)[0] += 1  # a bit of head 2 in block 0, layer 1
    assert BlockDigests(one, heads=[2])([0, 3]) == {"2": [BlockDigests(one, heads=[2])([0])["2"][0], whole["2"][0]]}
    assert BlockDigests(one, heads=[2])([0])["2"][0] != BlockDigests(caches(layout, range(4)))([0])["2"][0]


def test_records_of_every_worker_merge_into_one_per_side():
    def rec(rank, digests, **kw):
        return TransferRecord("t", "receive", "Fused", 2, 0, 40, 10, 100, 64, 1, digests=digests, rank=rank, **kw)
    merged = merge_ranks([rec(1, {"1": ["b"]}, load_ms=3.0, t_load_start=5.0), rec(0, {"0": ["a"]}, load_ms=1.0,
                                                                                  t_load_start=4.0)])
    assert merged.digests is None and merged.bytes == 128 and merged.messages == 2  # digests: per channel
    assert merged.load_ms == 3.0 and merged.t_load_start == 4.0 and merged.rank is None
    assert merge_ranks([rec(0, None), rec(1, {"1": ["b"]}, error="late")]).error == "late"


def test_digests_agree_per_channel_even_where_prefill_replicas_differ():
    """Prefill TP 4 over 2 KV heads: workers 0, 1 hold head 0 and 2, 3 head 1, and their copies
    may differ in the last bits (seen on vLLM's CPU build). Decode TP 2 takes head 0 from worker
    0 and head 1 from worker 3 (replica q mod 2): those copies are what must arrive."""
    def rec(side, rank, digests):
        return TransferRecord("t", side, "Fused", 1, 0, 40, 10, 100, 64, 1, digests=digests, rank=rank)
    sent = [rec("send", 0, {"0": ["a0"]}), rec("send", 1, {"0": ["a1"]}), rec("send", 2, {"1": ["b2"]}),
            rec("send", 3, {"1": ["b3"]})]
    assert [(s.prefill_rank, s.decode_rank) for s in shares(4, 2, 2)] == [(0, 0), (3, 1)]
    assert digests_agree(sent, [rec("receive", 0, {"0": ["a0"]}), rec("receive", 1, {"1": ["b3"]})], 4, 2)
    # another replica's copy, a missing head, a missing worker: each fails
    assert not digests_agree(sent, [rec("receive", 0, {"0": ["a1"]}), rec("receive", 1, {"1": ["b3"]})], 4, 2)
    assert not digests_agree(sent, [rec("receive", 0, {}), rec("receive", 1, {"1": ["b3"]})], 4, 2)
    assert not digests_agree(sent, [rec("receive", 1, {"1": ["b3"]})], 4, 2)
    # 1 -> 4: each head to two decode workers; 2 -> 2 and "all" (no head axis): worker to worker
    one = [rec("send", 0, {"0": ["a"], "1": ["b"]})]
    assert digests_agree(one, [rec("receive", q, {str(q // 2): ["ab"[q // 2]]}) for q in range(4)], 1, 4)
    assert digests_agree([rec("send", r, {"all": [r]}) for r in range(2)],
                         [rec("receive", r, {"all": [r]}) for r in range(2)], 2, 2)
    assert digests_agree([rec("send", 0, None)], [rec("receive", 0, {"0": ["a"]})], 1, 1) is None
    # MLA's latent ("all": no heads to cut) from a TP-2 prefill engine: the first worker's copy is what must
    # arrive (the second sent nothing)
    latent = [rec("send", 0, {"all": ["l0"]}), rec("send", 1, {"all": ["l1"]})]
    assert digests_agree(latent, [rec("receive", 0, {"all": ["l0"]})], 2, 1)
    assert not digests_agree(latent, [rec("receive", 0, {"all": ["l1"]})], 2, 1)
    # into a TP-2 decode engine: decode worker 0 relayed it to worker 1 (relay.py), which must hold prefill
    # worker 0's copy too, at equal degrees as well (prefill worker 1's own copy crossed nowhere)
    relayed = rec("receive", 1, {"all": ["l0"]})
    relayed.relayed_bytes = 64
    assert digests_agree(latent[:1], [rec("receive", 0, {"all": ["l0"]}), relayed], 1, 2)
    assert digests_agree(latent, [rec("receive", 0, {"all": ["l0"]}), relayed], 2, 2)
    wrong = rec("receive", 1, {"all": ["l1"]})
    wrong.relayed_bytes = 64
    assert not digests_agree(latent, [rec("receive", 0, {"all": ["l0"]}), wrong], 2, 2)
    assert not digests_agree(latent[:1], [rec("receive", 0, {"all": ["l0"]})], 1, 2)  # a worker's record missing


def test_one_head_held_whole_crosses_once_and_decode_worker_0_relays_it():
    """MLA's latent (vLLM counts one KV head, every worker holds it whole): prefill worker 0 to
    decode worker 0 whatever the degrees; the other decode workers take it from worker 0."""
    for p, d in ((1, 1), (2, 1), (1, 2), (2, 2), (4, 2)):
        assert shares(p, d, 1) == [Share(0, 0, range(0, 1))]
        assert [Placement(q, p, d, 1, is_producer=False).relays for q in range(d)] == [d > 1] * d
        assert not any(Placement(r, p, d, 1, is_producer=True).relays for r in range(p))
    assert Placement(1, 2, 2, 1, is_producer=True).my_shares() == []  # sends nothing (SendSide.silent)
    assert Placement(1, 1, 2, 1, is_producer=False).my_shares() == []  # its channel is the relay's
    assert not Placement(0, 1, 2, 2, is_producer=False).relays  # two heads: each decode worker its own
    place = Placement(0, 1, 4, 1, is_producer=False)
    assert place.relay_rendezvous("/run/kv", 3) == "/run/kv.relay3"
    assert place.relay_rendezvous("tcp://10.0.0.2:7100", 1).endswith("kv-relay-7100.d1")  # a file on this host


def test_a_lossy_transfer_between_degrees_is_judged_part_by_part():
    """1 -> 2 with a codec: each decode worker's part checksum against the one its prefill worker
    computed for it; a part that differs, or a whole-payload checksum where parts are due, fails."""
    def rec(side, rank, head, payload):
        return TransferRecord("t", side, "FusedInt8", 1, 0, 40, 10, 100, 64, 1, digests={head: ["x" + head]},
                              rank=rank, codec="int8/block/64", payload_digest=payload)
    sent = [TransferRecord("t", "send", "FusedInt8", 1, 0, 40, 10, 100, 64, 1, digests={"0": ["x0"], "1": ["x1"]},
                           codec="int8/block/64", payload_digest={"0": "a", "1": "b"})]
    assert digests_agree(sent, [rec("receive", 0, "0", {"0": "a"}), rec("receive", 1, "1", {"0": "b"})], 1, 2)
    assert not digests_agree(sent, [rec("receive", 0, "0", {"0": "a"}), rec("receive", 1, "1", {"0": "a"})], 1, 2)
    assert not digests_agree(sent, [rec("receive", 0, "0", "a"), rec("receive", 1, "1", {"0": "b"})], 1, 2)


# --------------------------------------------------------------------------- KV cut by heads, joined
def _payload(heads: range, seed: int = 1) -> torch.Tensor:
    """Two layers of 3 blocks of `heads` (of 4), as a prefill worker holding them gathers them."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 3, 4, T, C, generator=g)[:, :, heads.start:heads.stop].contiguous()


def _sender(paths, out, kind, p, d, rank):
    place = Placement(rank, p, d, 4, is_producer=True)
    kv = caches("cpu", place.heads)
    first = place.heads.start
    transport = TransportSettings(kind, staging_mb=8)
    targets = [(open_channel("sender", torch.device("cpu"), transport, paths[(s.prefill_rank, s.decode_rank)],
                             "127.0.0.1", 60), range(s.heads.start - first, s.heads.stop - first), *place.slot(s))
               for s in place.my_shares()]
    ch = ShardedSender(kv, targets)
    ch.send("t", 0, 2, torch.tensor([7, 8, 9]), nbytes=24)  # not KV: every decode peer gets it whole
    payload = _payload(place.heads)
    buf = kv.typed(ch.alloc(payload.numel() * 4)).view(payload.shape).copy_(payload)
    ch.send("t", 1, 2, buf, nbytes=buf.numel() * 4)
    ch.codec = _codec(kv)  # a lossy strategy's payload: cut by head as well
    payload = ch.codec.encode_plan(CODEC_IDS, ch.alloc(ch.codec.nbytes(kv.n_layers, len(CODEC_IDS))))()
    ch.send("c", 0, 1, payload, nbytes=payload.numel())
    ch.flush()
    os._exit(0)


CODEC_IDS = [4, 1, 7, 2]  # values of a whole number of float32 words before the scales (real blocks: 16 tokens or more)


def _codec(kv: KVBlocks) -> Codec:
    return Codec("int8").attach(kv, T, C // 2)  # K and V side by side: a scale each


def _receiver(paths, out, kind, p, d, rank):
    place = Placement(rank, p, d, 4, is_producer=False)
    kv = caches("cpu", place.heads)
    mine = [paths[(s.prefill_rank, s.decode_rank)] for s in place.my_shares()]
    ch = open_channel("receiver", torch.device("cpu"), TransportSettings(kind, staging_mb=8),
                      mine if len(mine) > 1 else mine[0], "127.0.0.1", 60)
    if len(mine) > 1:
        ch = HeadJoinReceiver(kv, ch, len(mine))
    ids, kv_msg = ch.wait("t")
    late = ch.wait("t", 1)[0]  # one message by index: the same join
    got = kv.typed(kv_msg.payload).view(2, 3, len(place.heads), T, C)
    ok = torch.equal(ids.payload.view(torch.int64), torch.tensor([7, 8, 9])) and torch.equal(got, _payload(place.heads))
    ok = ok and torch.equal(late.payload, kv_msg.payload) and kv_msg.meta["nbytes"] == kv_msg.payload.numel()
    codec = _codec(kv)
    if len(mine) > 1:
        ch.codec = codec
    (lossy,) = ch.wait("c")
    # the compressed payload of this worker's heads, as if it had compressed them itself
    own = codec.encode_plan(CODEC_IDS, torch.empty(codec.nbytes(kv.n_layers, len(CODEC_IDS)), dtype=torch.uint8))()
    ok = ok and torch.equal(lossy.payload, own) and len(lossy.meta.get("parts", [own])) == len(mine)
    out.put((rank, ok, (kv_msg.index, kv_msg.count)))
    ch.release("t")
    ch.release("c")
    out.close()
    out.join_thread()
    os._exit(0)


@SLOW  # 3-8 s a cell with staged buffers (a process per worker), 6-21 s with gloo
# gloo's cells of one-sided cuts and joins (1 to 2, 2 to 1) in make test-full: 4 to 2 does both
@pytest.mark.parametrize(("p", "d", "kind"), [
    pytest.param(p, d, kind, marks=FULL if (kind, p) == ("gloo", 1) or (kind, d) == ("gloo", 1) else ())
    for kind in ("staged", "gloo") for p, d in ((1, 2), (2, 1), (4, 2))])
def test_kv_is_cut_by_heads_and_joined_between_degrees(p, d, kind, tmp_path):
    """Blocks in the KV dtype and a lossy strategy's compressed payload (its parts: what each
    worker's heads alone compress to) cut by the prefill workers, joined by the decode workers."""
    ctx = mp.get_context("spawn")
    paths = {(r, q): str(tmp_path / f"p{r}d{q}") for r in range(p) for q in range(d)}
    out = ctx.Queue()
    procs = [ctx.Process(target=_receiver, args=(paths, out, kind, p, d, q)) for q in range(d)]
    procs += [ctx.Process(target=_sender, args=(paths, out, kind, p, d, r)) for r in range(p)]
    for proc in procs:
        proc.start()
    try:
        got = sorted(out.get(timeout=90) for _ in range(d))
    finally:
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
        remove_leftovers(list(paths.values()))
    assert got == [(q, True, (1, 2)) for q in range(d)]
    assert all(proc.exitcode == 0 for proc in procs)


_OPENING = {"host": "127.0.0.1", "timeout_s": 60, "device": torch.device("cpu"),
            "transport": TransportSettings("staged", staging_mb=8)}  # open_sharded's channels, as a worker opens them


def _instance_sender(bases, i, p, d, rank, n_decode):
    """Worker `rank` of prefill instance i: one request's KV (and a lossy payload) to each decode
    instance, each through the channel its peer names (FanOut.to), as the worker routes them."""
    place = Placement(rank, p, d, 4, is_producer=True)
    kv = caches("cpu", place.heads, seed=i)
    ch = open_sharded(place, kv, [bases[i, j] for j in range(n_decode)],
                      _OPENING, on_open=None)
    assert isinstance(ch, FanOut) == (n_decode > 1)
    for j in range(n_decode):
        to = ch.to(j) if n_decode > 1 else ch
        payload = _payload(place.heads, seed=10 * i + j)
        buf = kv.typed(ch.alloc(payload.numel() * 4)).view(payload.shape).copy_(payload)
        to.send(f"r{i}{j}", 0, 1, buf, nbytes=buf.numel() * 4)
    codec = _codec(kv)
    use_codec(ch, codec)  # a lossy strategy's payloads from now on (worker.use_codec)
    for j in range(n_decode):
        to = ch.to(j) if n_decode > 1 else ch
        lossy = codec.encode_plan(CODEC_IDS, ch.alloc(codec.nbytes(kv.n_layers, len(CODEC_IDS))))()
        to.send(f"c{i}{j}", 0, 1, lossy, nbytes=lossy.numel())
    ch.flush()
    os._exit(0)


def _instance_receiver(bases, out, j, p, d, rank, n_prefill):
    """Worker `rank` of decode instance j: every prefill instance's request for it, its heads joined."""
    place = Placement(rank, p, d, 4, is_producer=False)
    kv = caches("cpu", place.heads)
    ch = open_sharded(place, kv, [bases[i, j] for i in range(n_prefill)],
                      _OPENING, on_open=None)
    ok = True
    for i in range(n_prefill):
        (msg,) = ch.wait(f"r{i}{j}")
        got = kv.typed(msg.payload).view(2, 3, len(place.heads), T, C)
        ok = ok and torch.equal(got, _payload(place.heads, seed=10 * i + j))
        ch.release(f"r{i}{j}")
    use_codec(ch, _codec(kv))
    for i in range(n_prefill):
        (lossy,) = ch.wait(f"c{i}{j}")
        theirs = caches("cpu", place.heads, seed=i)  # what instance i holds of these heads, compressed here
        codec = _codec(theirs)
        own = codec.encode_plan(CODEC_IDS, torch.empty(codec.nbytes(kv.n_layers, len(CODEC_IDS)), dtype=torch.uint8))()
        ok = ok and torch.equal(lossy.payload, own)
        ch.release(f"c{i}{j}")
    out.put((j, rank, ok))
    out.close()
    out.join_thread()
    os._exit(0)


@pytest.mark.parametrize(("n_prefill", "p", "n_decode", "d"), [
    (2, 2, 2, 1),  # prefill: a FanOut of whole senders; decode: 2 instances x 2 workers' parts joined
    pytest.param(1, 1, 2, 2, marks=SLOW),  # prefill: a FanOut of senders that cut for 2 decode workers
    pytest.param(2, 1, 1, 2, marks=SLOW),  # decode: 2 instances' single parts
])
def test_tensor_parallel_instances_send_each_request_to_the_decode_instance_it_names(n_prefill, p, n_decode, d,
                                                                                    tmp_path):
    """Serving mode with several instances a side and tensor parallelism: each prefill worker
    holds a sharded channel to every decode instance (open_sharded over one rendezvous base per
    instance pair) and sends a request to the one it names; each decode worker joins its heads of
    every prefill instance's requests, blocks and lossy payloads alike."""
    ctx = mp.get_context("spawn")
    bases = {(i, j): str(tmp_path / f"i{i}j{j}") for i in range(n_prefill) for j in range(n_decode)}
    out = ctx.Queue()
    procs = [ctx.Process(target=_instance_receiver, args=(bases, out, j, p, d, q, n_prefill))
             for j in range(n_decode) for q in range(d)]
    procs += [ctx.Process(target=_instance_sender, args=(bases, i, p, d, r, n_decode))
              for i in range(n_prefill) for r in range(p)]
    for proc in procs:
        proc.start()
    try:
        got = sorted(out.get(timeout=90) for _ in range(n_decode * d))
    finally:
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
        remove_leftovers([Placement(0, p, d, 4, True).rendezvous(b, s) for b in bases.values()
                          for s in shares(p, d, 4)])
    assert got == [(j, q, True) for j in range(n_decode) for q in range(d)]
    assert all(proc.exitcode == 0 for proc in procs)


class _Outbox:
    """A decode peer's channel as a prefill worker's ShardedSender sees it: what was sent to it."""

    last_written = None

    def __init__(self):
        self.sent = []

    def alloc(self, nbytes):
        return torch.empty(nbytes, dtype=torch.uint8)

    def send(self, transfer_id, index, count, payload, background=False, **meta):
        self.sent.append((payload.clone(), meta))
        return payload.numel()


def test_a_lossy_payload_is_cut_for_each_decode_peer_unless_a_fault_cut_it_short():
    """1 -> 2: each decode peer gets the part of its heads, its header describing that part; a
    payload a fault truncated is not a whole number of blocks' parts: it goes as it is, under the
    header of the intact one, so each peer finds it short."""
    kv = caches("cpu", range(4))
    codec = _codec(kv)
    peers = [_Outbox(), _Outbox()]
    ch = ShardedSender(kv, [(peers[0], range(0, 2), 0, 1), (peers[1], range(2, 4), 0, 1)])
    ch.codec = codec
    payload = codec.encode_plan(CODEC_IDS, torch.empty(codec.nbytes(kv.n_layers, len(CODEC_IDS)), dtype=torch.uint8))()
    ch.send("t", 0, 1, payload, nbytes=payload.numel())
    for peer, heads in zip(peers, (range(0, 2), range(2, 4))):
        part, meta = peer.sent[0]
        assert torch.equal(part, codec.cut(payload, heads)) and meta["nbytes"] == part.numel() and meta["heads"] == 2
    short = payload[: payload.numel() // 2]
    ch.send("u", 0, 1, short, nbytes=payload.numel())
    assert all(torch.equal(peer.sent[1][0], short) and peer.sent[1][1]["nbytes"] == payload.numel() for peer in peers)


class _Inbox:
    """Two prefill workers' parts of one transfer, as the fan-in channel hands them out."""

    inbox = None

    def __init__(self, parts):
        self.parts = parts

    def wait(self, transfer_id, index=None):
        return self.parts if index is None else [self.parts[index]]


def test_a_damaged_part_is_reported_not_hidden_by_the_join():
    """2 -> 1: the decode worker joins two prefill workers' heads. A part cut short or flipped in
    transit is named by check_message on the joined message (the joined bytes would hide it)."""
    from transfer_strategies.faults import check_message, payload_checksum
    from transfer_strategies.transport.message import Message, as_bytes

    kv = caches("cpu", range(4))

    def part(slot, payload, **meta):
        data = as_bytes(payload).clone()
        meta = {"heads": 2, "nbytes": data.numel(), "checksum": payload_checksum(data), **meta}
        return Message("t", slot, 2, data, meta, 0.0, 0.0)

    halves = [_payload(range(0, 2)), _payload(range(2, 4))]
    whole = HeadJoinReceiver(kv, _Inbox([part(0, halves[0]), part(1, halves[1])]), 2).wait("t")[0]
    assert check_message(whole) is None
    assert torch.equal(kv.typed(whole.payload).view(2, 3, 4, T, C), _payload(range(4)))

    def joined(parts):
        return HeadJoinReceiver(kv, _Inbox(parts), 2).wait("t")[0]
    short = part(1, halves[1])
    short.payload = short.payload[:-8]
    assert check_message(joined([part(0, halves[0]), short])).startswith("truncated")
    flipped = part(0, halves[0])
    flipped.payload[5] ^= 1
    assert "checksum differs" in check_message(joined([flipped, part(1, halves[1])]))
