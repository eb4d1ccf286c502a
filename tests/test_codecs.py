"""The lossy strategies' codecs (transfer_strategies/codecs.py) and their checks, without engines:
the error stays within each codec's bound on both backends' layouts, the payload is as small as
its format says, a changed or missing scale is caught by the digests and checksums both sides
compare, and a lossy run is judged by its transport and its accuracy gate, not its outputs."""

import dataclasses
import os
import subprocess
import sys

import pytest
import torch

from harness.records.accuracy import accuracy_cost
from harness.records.join import codec_fields
from harness.records.transfer_records import digests_agree, merge_ranks
from harness.records.verdict import judge
from tests.conftest import ROOT, SLOW, cells
from tests.helpers.kv import layer_shape, make_kv
from transfer_strategies.codecs import Codec, CodecParams, reconstruction_error
from transfer_strategies.connector_config import ContractError
from transfer_strategies.digests import BlockDigests
from transfer_strategies.faults import payload_checksum
from transfer_strategies.fused_int4 import FusedInt4Connector
from transfer_strategies.kv_blocks import KVBlocks
from transfer_strategies.records import TransferRecord

BLOCK, HEADS, HEAD_SIZE = 16, 2, 32
CODECS = [("fp8", CodecParams()), ("int8", CodecParams()), ("int8", CodecParams("token")),
          ("int4", FusedInt4Connector.Params())]


def cpu_layout(n_blocks=12, n_layers=3, fill=torch.randn) -> KVBlocks:
    """vLLM's CPU backend: [blocks, KV heads, tokens, K and V side by side]."""
    return KVBlocks({f"l{i}": fill(n_blocks, HEADS, BLOCK, 2 * HEAD_SIZE) for i in range(n_layers)}, n_blocks, HEADS)


def gpu_layout(n_blocks=12, n_layers=3, dtype=torch.bfloat16) -> KVBlocks:
    """FlashAttention's: [K/V, blocks, tokens, KV heads, head size]."""
    return KVBlocks({f"l{i}": torch.randn(2, n_blocks, BLOCK, HEADS, HEAD_SIZE).to(dtype) for i in range(n_layers)},
                    n_blocks, HEADS)


def gathered(kv: KVBlocks, ids) -> torch.Tensor:
    out = torch.empty(kv.n_layers, *kv.layer_shape(len(ids)), dtype=kv.dtype)
    return kv.gather(ids, out, range(kv.n_layers))


def roundtrip(codec: Codec, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(payload, reconstruction) of a buffer of blocks, as the sender's check makes them."""
    n_layers, n_blocks = blocks.shape[0], blocks.shape[1 + codec.kv.block_dim]
    payload = codec.encode(blocks, torch.empty(codec.nbytes(n_layers, n_blocks), dtype=torch.uint8))
    return payload, codec.decode(payload, n_layers, n_blocks)


def with_outliers(kv: KVBlocks) -> KVBlocks:
    """A few values 50x the rest (as real K caches have in some features): the bound is relative
    to each group's largest magnitude, so it must hold there too."""
    for t in kv.layers:
        t.view(-1)[:: 997] *= 50
    return kv


@pytest.mark.parametrize("layout", [cpu_layout, gpu_layout])
@pytest.mark.parametrize("fmt,params", CODECS, ids=lambda c: getattr(c, "scale", c))
def test_the_reconstruction_is_within_the_codecs_bound_and_the_payload_as_small_as_its_format(layout, fmt, params):
    kv = with_outliers(layout())
    codec = Codec(fmt, params).attach(kv, BLOCK, HEAD_SIZE)
    ids = [3, 4, 5, 9, 0]
    blocks = gathered(kv, ids)
    payload, rebuilt = roundtrip(codec, blocks)
    assert payload.dtype == torch.uint8 and payload.numel() == codec.nbytes(kv.n_layers, len(ids))
    values = blocks.numel() * codec.format.bits // 8
    groups = blocks.numel() // codec.channels // (BLOCK if params.scale == "block" else 1)
    assert payload.numel() == values + 4 * groups  # the values, then one float32 scale per group
    assert payload.numel() < blocks.numel() * blocks.element_size() * (0.6 if fmt != "int4" or
                                                                         kv.dtype == torch.float32 else 0.35)
    err = reconstruction_error(blocks, rebuilt)
    assert len(err["max_rel"]) == kv.n_layers
    assert 0 < max(err["max_rel"]) <= codec.max_rel_error()
    assert all(0 < m < 1 for m in err["mean_rel"])
    # the receiver's reconstruction, from the bytes alone, is the sender's bit for bit
    other = Codec(fmt, params).attach(kv, BLOCK, HEAD_SIZE)
    received = other.decode(payload.clone(), kv.n_layers, len(ids))
    assert torch.equal(received.view(torch.uint8), rebuilt.view(torch.uint8))


@pytest.mark.parametrize("layout", [cpu_layout, gpu_layout])
def test_a_requests_blocks_both_ways_through_the_cache(layout):
    """What the strategies run: encode_plan compresses blocks straight from the cache (as `encode`
    does a gathered buffer), decode_into writes the reconstruction into the receiver's blocks past
    the ones its prefix cache held, leaving those alone."""
    sender, receiver = layout(), layout()
    codec = Codec("int8").attach(sender, BLOCK, HEAD_SIZE)
    ids, dst = [7, 8, 2], [1, 5, 6]
    out = torch.empty(codec.nbytes(sender.n_layers, 3), dtype=torch.uint8)
    payload = codec.encode_plan(ids, out)()
    assert payload is out and torch.equal(out, codec.encode(gathered(sender, ids), torch.empty_like(out)))
    cached = gathered(receiver, dst[:1]).clone()
    Codec("int8").attach(receiver, BLOCK, HEAD_SIZE).decode_into(payload, dst, first=1)
    rebuilt = codec.decode(payload, sender.n_layers, 3)
    assert torch.equal(gathered(receiver, dst[1:]), rebuilt.narrow(1 + sender.block_dim, 1, 2))
    assert torch.equal(gathered(receiver, dst[:1]), cached)
    with pytest.raises(ValueError, match="bytes, got"):
        codec.decode_into(payload[:-4], dst)


def heads_of_layout(caches: dict, axis: int, heads: range) -> KVBlocks:
    """The engine holding only `heads` of caches' KV heads (a tensor-parallel worker's share)."""
    n_blocks = next(iter(caches.values())).shape[0 if axis == 1 else 1]
    return KVBlocks({k: t.narrow(axis, heads.start, len(heads)).contiguous() for k, t in caches.items()}, n_blocks,
                    len(heads))


@pytest.mark.parametrize("axis", [1, 3], ids=["cpu", "gpu"])  # the head axis of the layer: CPU's, FlashAttention's
@pytest.mark.parametrize("fmt,params", CODECS, ids=lambda c: getattr(c, "scale", c))
def test_a_payload_cut_by_head_is_those_heads_encoded_and_the_cuts_join_into_the_whole(axis, fmt, params):
    """No scale spans two heads: the part of a payload a decode worker of another TP degree takes is
    the payload its own heads would give, and a decode worker fed by several prefill workers joins
    their parts into the payload of all its heads (head_shards.py)."""
    shape = [12, 4, BLOCK, 2 * HEAD_SIZE] if axis == 1 else [2, 12, BLOCK, 4, HEAD_SIZE]
    caches = {f"l{i}": torch.randn(shape) for i in range(3)}
    whole = KVBlocks(caches, 12, 4)
    codec = Codec(fmt, params).attach(whole, BLOCK, HEAD_SIZE)
    ids = [3, 4, 9]
    payload = codec.encode_plan(ids, torch.empty(codec.nbytes(3, 3), dtype=torch.uint8))()
    parts = []
    for heads in (range(0, 1), range(1, 3), range(3, 4)):
        mine = Codec(fmt, params).attach(heads_of_layout(caches, axis, heads), BLOCK, HEAD_SIZE)
        own = mine.encode_plan(ids, torch.empty(mine.nbytes(3, 3), dtype=torch.uint8))()
        part = codec.cut(payload, heads)
        assert part.numel() == codec.head_nbytes(3, len(heads)) and torch.equal(part, own)
        parts.append((part, len(heads)))
    assert torch.equal(codec.join(parts), payload)
    assert codec.blocks_in(payload.numel() - 1, 4) is None
    with pytest.raises(ValueError, match="not whole blocks"):
        codec.cut(payload[:-4], range(0, 1))
    with pytest.raises(ValueError, match="do not make"):
        codec.join(parts[:2])


def test_the_default_scales_keep_k_and_v_apart_on_the_cpu_layout():
    """K and V side by side in one axis (CPU): channels = the head size gives each its own scale,
    so a V ten times K's size costs K nothing."""
    kv = cpu_layout()
    for t in kv.layers:
        t[..., HEAD_SIZE:] *= 10
    codec = Codec("int8").attach(kv, BLOCK, HEAD_SIZE)
    assert codec.channels == HEAD_SIZE and codec.token_axis == 2
    blocks = gathered(kv, [1, 2])
    _, rebuilt = roundtrip(codec, blocks)
    k_err = (rebuilt[..., :HEAD_SIZE] - blocks[..., :HEAD_SIZE]).abs().amax()
    assert k_err <= blocks[..., :HEAD_SIZE].abs().amax() * codec.max_rel_error()


def test_empty_and_all_zero_blocks():
    kv = cpu_layout(fill=torch.zeros)
    codec = Codec("fp8").attach(kv, BLOCK, HEAD_SIZE)
    payload, rebuilt = roundtrip(codec, gathered(kv, []))
    assert payload.numel() == 0 and rebuilt.numel() == 0
    assert reconstruction_error(gathered(kv, []), rebuilt) is None  # nothing moved: nothing to measure
    payload, rebuilt = roundtrip(codec, gathered(kv, [2]))
    assert torch.count_nonzero(rebuilt) == 0
    assert reconstruction_error(gathered(kv, [2]), rebuilt)["max_rel"] == [0.0] * 3


def test_channels_that_do_not_fit_the_layout_or_are_negative_are_refused():
    with pytest.raises(ValueError, match="channels=24 must divide"):
        Codec("int8", CodecParams(channels=24)).attach(cpu_layout(), BLOCK, HEAD_SIZE)
    with pytest.raises(ContractError, match="channels must be >= 0"):
        CodecParams(channels=-1)


@pytest.mark.parametrize("block_dim", [0, 1])
def test_digests_of_blocks_held_in_a_buffer_equal_the_caches(block_dim):
    """A lossy sender digests its reconstruction (a buffer); the receiver digests its cache: the
    same blocks must give the same digests either way."""
    kv = make_kv(block_dim)
    kv.n_heads, kv.head_dim = 1, None  # the helper's layouts carry no head axis to split by
    digests = BlockDigests(kv)
    ids = [5, 6, 7, 20, 2]
    buf = torch.empty(kv.n_layers, *layer_shape(block_dim)).narrow(1 + block_dim, 0, len(ids)).contiguous()
    kv.gather(ids, buf, range(kv.n_layers))
    assert digests.launch(ids, buf).result() == digests(ids)


def receiver_digests(kv: KVBlocks, payload: torch.Tensor, ids: list[int], codec: Codec) -> dict:
    """What a decode engine digests after reconstructing a payload into blocks `ids` of its cache."""
    kv.scatter(ids, codec.decode(payload, kv.n_layers, len(ids)), range(kv.n_layers))
    return BlockDigests(kv)(ids)


def record(side, digests, payload, codec="int8/block/32", **kw) -> TransferRecord:
    return TransferRecord(transfer_id="t", side=side, strategy="FusedInt8Connector", blocks=2, skip_blocks=0,
                          tokens=40, kv_cache_blocks=12, kv_cache_bytes=0, bytes=payload.numel(), messages=1,
                          digests=digests, codec=codec, payload_digest=payload_checksum(payload), **kw)


def test_a_changed_or_missing_scale_is_caught():
    """The sender digests the blocks the receiver should rebuild and checksums the payload; a byte
    of one scale changed on the way changes both the receiver's blocks and its checksum, and a
    payload whose scales are cut off is refused before it is read."""
    sender, receiver = gpu_layout(dtype=torch.float32), gpu_layout(dtype=torch.float32)
    codec = Codec("int8").attach(sender, BLOCK, HEAD_SIZE)
    ids = [4, 5]
    payload, rebuilt = roundtrip(codec, gathered(sender, ids))
    sent = record("send", BlockDigests(sender).launch(ids, rebuilt).result(), payload)
    intact = record("receive", receiver_digests(receiver, payload.clone(), ids, codec), payload)
    assert digests_agree([sent], [intact], 1, 1) is True

    damaged = payload.clone()
    damaged[codec.value_bytes(sender.n_layers, len(ids)) + 1] ^= 0x10  # a byte of the first scale
    got = record("receive", receiver_digests(receiver, damaged, ids, codec), damaged)
    assert got.digests != sent.digests and got.payload_digest != sent.payload_digest
    assert digests_agree([sent], [got], 1, 1) is False
    # the payload alone differing (the blocks as sent) fails it too: the transport must be exact
    assert digests_agree([sent], [dataclasses.replace(intact, payload_digest=got.payload_digest)], 1, 1) is False
    # between other degrees each part's checksum is judged: a whole payload's does not stand for one
    assert digests_agree([sent], [dataclasses.replace(intact, rank=0)], 1, 2) is False

    with pytest.raises(ValueError, match=r"is \d+ bytes, got"):
        codec.decode(payload[: codec.value_bytes(sender.n_layers, len(ids))], sender.n_layers, len(ids))


def test_a_lossless_transfer_whose_blocks_changed_still_fails():
    """Only a record that names a codec is judged by its reconstruction: a lossless strategy's
    sender digests its own cache, so a receiver holding anything else fails."""
    kv = gpu_layout(dtype=torch.float32)
    ids = [1, 2]
    sent = BlockDigests(kv)(ids)
    kv.layers[0][0, 1, 3, 0, 0] += 1e-6
    plain = {"strategy": "FusedConnector", "blocks": 2, "skip_blocks": 0, "tokens": 40, "kv_cache_blocks": 12,
             "kv_cache_bytes": 0, "bytes": 1, "messages": 1}
    assert digests_agree([TransferRecord("t", "send", digests=sent, **plain)],
                         [TransferRecord("t", "receive", digests=BlockDigests(kv)(ids), **plain)], 1, 1) is False


def test_the_codec_error_of_tensor_parallel_workers_merges_largest_of_largest_and_mean_of_means():
    payload = torch.zeros(4, dtype=torch.uint8)
    a = record("send", {"0": ["x"]}, payload, rank=0, codec_error={"max_abs": [1.0, 2.0], "max_rel": [0.1, 0.2],
                                                                    "mean_abs": [0.5, 0.5], "mean_rel": [0.01, 0.03]})
    b = record("send", {"1": ["y"]}, payload, rank=1, codec_error={"max_abs": [3.0, 1.0], "max_rel": [0.3, 0.1],
                                                                    "mean_abs": [1.5, 0.5], "mean_rel": [0.03, 0.01]})
    merged = merge_ranks([a, b])
    assert merged.codec_error == {"max_abs": [3.0, 2.0], "max_rel": [0.3, 0.2], "mean_abs": [1.0, 0.5],
                                  "mean_rel": [0.02, 0.02]}
    row = codec_fields(merged, None)
    assert row["codec"] == "int8/block/32" and row["codec_max_rel"] == 0.3 and row["codec_mean_rel"] == 0.02


def test_a_lossy_run_is_judged_by_its_transport_and_its_accuracy_gate_not_its_outputs():
    rows = [{"match": True, "codec": "int4/token/32", "codec_max_rel": 0.05, "codec_mean_rel": 0.1,
             "first_divergence": None, "max_logprob_diff": 0.2},
            {"match": False, "codec": "int4/token/32", "codec_max_rel": 0.07, "codec_mean_rel": 0.12,
             "first_divergence": 3, "max_logprob_diff": 1.5}]
    cost = accuracy_cost(rows, match_rate=0.5, self_match_rate=1.0)
    assert cost["codec"] == "int4/token/32" and cost["codec_max_rel"] == 0.07 and cost["accuracy_drop"] == 0.5
    assert cost["first_divergence_mean"] == 3 and cost["logprob_drift_max"] == 1.5
    counts = {"mismatches": 1, "near_ties": 0, "digest_checked": 2, "digest_failures": 0}
    assert judge(counts, noise=0)[0] == "mismatch"  # a lossless strategy must give the baseline's outputs
    assert judge(counts, noise=0, lossy=True, accuracy_drop=0.5) == ("ok", None)
    status, why = judge(counts, noise=0, lossy=True, accuracy_drop=0.5, max_accuracy_drop=0.25)
    assert status == "accuracy_drop" and "0.500 below" in why
    assert judge({**counts, "digest_failures": 1}, noise=0, lossy=True)[0] == "mismatch"  # the transport is exact
    assert accuracy_cost([{"match": True}], match_rate=1.0, self_match_rate=None)["codec"] is None


@pytest.mark.parametrize("fmt,per_token", [("fp8", False), ("int8", False), ("int8", True), ("int4", True)])
@pytest.mark.parametrize("kernel", ["_encode", "_decode", "_check"])
def test_the_cuda_kernels_compile_for_hopper(kernel, fmt, per_token):
    """codec_kernel.py's kernels compiled for sm_90 with the Llama-3-8B shape's constants, no GPU
    needed (scripts/bench_codecs.py --check compares them with torch on one, the sender's check
    with its torch path too); each reads or writes the KV cache 16 bytes an instruction (told the
    blocks' alignment, block_start: one bf16 at a time, they ran at half of HBM's bandwidth), but
    the FP8 check, which is not told it (codec_kernel.CodecKernel._check_consts: wrong on the H200);
    the payload's values too."""
    pytest.importorskip("triton")
    from tests.helpers.hopper import compile_for_hopper, global_accesses
    from transfer_strategies import codec_kernel
    from transfer_strategies.codecs import FORMATS

    fn = getattr(codec_kernel, kernel)
    pointers = {"cache": "*bf16", "piece_offsets": "*i64", "ids": "*i64", "values": "*u8", "scales": "*fp32",
                "digests": "*i64", "payload_sums": "*i64", "error_max": "*fp32", "error_sum": "*fp64"}
    constexprs = {"T": 16, "S": 128, "BLOCK_T": 16, "C": 32 if fmt == "int4" else 128,
                  "FMT": codec_kernel.FORMAT_IDS[fmt], "PER_TOKEN": per_token, "QMAX": FORMATS[fmt].qmax,
                  "ELEMENT_BYTES": 2, "ALIGN": 1 if (kernel, fmt) == ("_check", "fp8") else 16}
    options = {"enable_fp_fusion": False} if kernel == "_check" else {}
    compiled = compile_for_hopper(fn, pointers, constexprs, {"block_elems", "stride_t", "stride_h"}, **options)
    assert ("atom.global" if kernel == "_check" else "st.global") in compiled.asm["ptx"]
    accesses = global_accesses(compiled)
    cache_access = "st.global.b16" if kernel == "_decode" else "ld.global.b16"  # one bf16 of the cache
    if constexprs["ALIGN"] == 1:
        assert accesses[cache_access] > 0
        return
    assert accesses[cache_access] == 0 and accesses["ld.global.v4.b32" if kernel != "_decode" else "st.global.v4.b32"]
    # and the payload's values several bytes an instruction (int4's went a byte at a time: its send 3.4x int8's)
    assert not accesses["st.global.b8" if kernel == "_encode" else "ld.global.b8"]


@SLOW  # 2-4 s a codec and layout: every program run in Python
# vLLM's CPU layout and one of FlashAttention's in make test; its other (HND) in make test-full
@pytest.mark.parametrize("layouts", cells([("cpu", "NHD"), ("HND",)], {("cpu", "NHD")}, ids="-".join))
def test_the_int_kernels_give_torchs_payloads_in_tritons_interpreter(layouts):
    """codec_kernel.py's int8 and int4 kernels, run by Triton's interpreter on CPU tensors, give
    the torch codec's payload byte for byte, write its float32 blocks, and the sender's check
    kernel its torch path's checksum, digests and errors (bf16 and float32 KV; what the
    interpreter cannot show: tests/helpers/interpreted_codecs.py). The GPU check is
    `scripts/bench_codecs.py --check`; this one runs wherever the tests do."""
    pytest.importorskip("triton")
    run = subprocess.run([sys.executable, "-m", "tests.helpers.interpreted_codecs", *layouts], cwd=ROOT,
                         capture_output=True, text=True, timeout=600, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for layout in layouts:
        assert f"int4 {layout} torch.bfloat16" in run.stdout and f"int8 {layout} torch.float32" in run.stdout
