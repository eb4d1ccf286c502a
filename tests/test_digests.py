"""Per-block digests: what a digest must see (and what it must not)."""

import pytest
import torch

from tests.conftest import SLOW
from tests.helpers.kv import NUM_BLOCKS, make_kv
from transfer_strategies.digests import BlockDigests as HeadDigests
from transfer_strategies.kv_blocks import KVBlocks


def BlockDigests(kv: KVBlocks, **kw):  # noqa: N802 - these caches have no head axis: one digest per block
    digests = HeadDigests(kv, **kw)
    return lambda ids: digests(ids)["all"]


def strided(kv: KVBlocks) -> KVBlocks:
    """The same blocks in a layout whose pieces are not contiguous (the digest's fallback path)."""
    layers = {}
    for name, t in zip(kv.names, kv.layers):
        wide = torch.zeros(*t.shape[:-1], t.shape[-1] * 2)
        wide[..., : t.shape[-1]] = t
        layers[name] = wide[..., : t.shape[-1]]
    out = KVBlocks(layers, NUM_BLOCKS)
    assert not out.contiguous
    return out


@pytest.mark.parametrize("contiguous", [True, False])
@pytest.mark.parametrize("block_dim", [0, 1])
def test_digests_follow_block_contents_not_block_ids(block_dim, contiguous):
    src = make_kv(block_dim)
    ids = [3, 4, 5, 20, 21, 9]
    dst = make_kv(block_dim, fill=torch.zeros)  # the same blocks under other ids, as a receiver holds them
    other = [10, 11, 0, 1, 2, 30]
    for s, d in zip(src.layers, dst.layers):
        d.index_copy_(block_dim, torch.tensor(other), s.index_select(block_dim, torch.tensor(ids)))
    if not contiguous:
        src, dst = strided(src), strided(dst)
    sent = BlockDigests(src)(ids)
    assert len(set(sent)) == len(ids)  # different contents, different digests
    assert BlockDigests(dst)(other) == sent
    assert BlockDigests(src)([]) == []


@pytest.mark.parametrize("block_dim", [0, 1])
def test_digests_see_one_flipped_bit_and_swapped_blocks_or_words(block_dim):
    kv = make_kv(block_dim)
    digest = BlockDigests(kv)
    ids = [5, 6, 7, 12]
    before = digest(ids)
    raw = kv.layers[2].view(torch.int32)  # one bit in the last layer, in block 7
    raw[(1, 7, 2, 1) if block_dim == 1 else (7, 2, 1, 0)] ^= 1 << 30
    assert [a != b for a, b in zip(before, digest(ids))] == [False, False, True, False]

    kv = make_kv(block_dim)
    digest = BlockDigests(kv)
    before = digest(ids)
    layer = kv.layers[0]
    a, b = layer.select(block_dim, 5).clone(), layer.select(block_dim, 6).clone()
    layer.select(block_dim, 5).copy_(b)
    layer.select(block_dim, 6).copy_(a)
    swapped = digest(ids)
    assert swapped[0] != before[0] and swapped[1] != before[1] and swapped[2:] == before[2:]

    kv = make_kv(block_dim)
    digest = BlockDigests(kv)
    before = digest(ids)
    block = (kv.layers[1][12] if block_dim == 0 else kv.layers[1][0, 12]).view(-1)  # two words trade places
    block[[0, 1]] = block[[1, 0]].clone()
    assert digest(ids)[3] != before[3]


def test_digest_products_wrap_around_rather_than_saturate():
    big = torch.tensor([2**31 - 1, -(2**31)], dtype=torch.int32)
    w = torch.tensor([3, 5], dtype=torch.int32)
    assert torch.mul(big, w).tolist() == [2**31 - 3, -(2**31)]


@pytest.mark.parametrize("block_dim", [0, 1])
def test_scattered_blocks_are_digested_as_each_block_alone(block_dim):
    """Many short runs (a cache used for a while) take one indexed gather per piece instead of a
    view per run; the digests must not depend on the path."""
    kv = make_kv(block_dim)
    digest = BlockDigests(kv)
    ids = [30, 2, 17, 5, 25, 9, 11, 0, 14]  # nine runs of one block
    assert digest(ids) == [digest([b])[0] for b in ids]


KERNEL_CHECK = """
import torch
from tests.helpers.kv import NUM_BLOCKS, make_kv
from transfer_strategies.digests import BlockDigests
from transfer_strategies.kv_blocks import KVBlocks

for block_dim in (0, 1):
    for dtype in (torch.float32, torch.bfloat16):
        kv = make_kv(block_dim)
        kv = KVBlocks({n: (t * 1e6).to(dtype) for n, t in zip(kv.names, kv.layers)}, NUM_BLOCKS)
        for ids in ([3, 4, 5, 20, 21, 9, 0], [7], list(range(NUM_BLOCKS))):
            assert BlockDigests(kv, kernel=True)(ids) == BlockDigests(kv, kernel=False)(ids), (block_dim, dtype, ids)
        wide = KVBlocks({"l": (torch.randn(6, 2, 2100) * 1e6).to(dtype)}, 6)  # more words than a chunk
        assert BlockDigests(wide, kernel=True)([5, 0, 1]) == BlockDigests(wide, kernel=False)([5, 0, 1])
        # per head: heads before tokens (CPU, HND) and after (NHD), a head's row longer than a chunk
        for shape, heads in (((9, 3, 5, 8), 3), ((2, 9, 5, 3, 8), 3), ((9, 2, 3, 5000), 2)):
            kv = KVBlocks({f"l{i}": (torch.randn(*shape) * 1e6).to(dtype) for i in range(2)}, 9, n_heads=heads)
            assert kv.head_dim is not None
            for ids in ([3, 4, 5, 8, 0], [7]):
                assert BlockDigests(kv, kernel=True)(ids) == BlockDigests(kv, kernel=False)(ids), (shape, dtype, ids)
# the payload checksum's kernel (faults.payload_sum on CUDA) against torch's, tail bytes and all
from transfer_strategies.digest_kernel import weighted_word_sum
from transfer_strategies.faults import checksum_hex, payload_sum
for n in (0, 3, 4, 1001, 70001):
    data = torch.randint(0, 256, (n,), dtype=torch.uint8)
    total = torch.zeros((), dtype=torch.int64)
    weighted_word_sum(data[: n // 4 * 4].view(torch.int32), total)
    total += data[n // 4 * 4:].to(torch.int64).sum()
    assert checksum_hex(int(total)) == checksum_hex(int(payload_sum(data))), n
print("same digests")
"""


@SLOW  # about 11 s in Triton's interpreter
def test_the_cuda_kernel_gives_the_torch_digests():
    """digest_kernel.py (CUDA's path) run by Triton's interpreter on CPU: the same digests as the
    torch path, for runs and scattered ids, words not a multiple of its chunk, and large values.
    In a process of its own: the interpreter must be chosen before triton is first imported."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(root))
    done = subprocess.run([sys.executable, "-c", KERNEL_CHECK], env=env, cwd=root, capture_output=True, text=True)
    assert done.returncode == 0 and "same digests" in done.stdout, done.stderr[-2000:]


@pytest.mark.parametrize("kernel", ["_weighted_block_sums", "_weighted_word_sum"])
def test_the_cuda_kernels_compile_for_hopper(kernel):
    """Triton's interpreter (above) accepts what its CUDA compiler refuses (a plain module global in
    the kernel failed an H200 run's engines at start-up): compiled here for sm_90, no GPU needed.
    Both read 16 bytes an instruction (the block sums once told their blocks' alignment; the word
    sum where the payload is a multiple of 16 words)."""
    pytest.importorskip("triton")
    from tests.helpers.hopper import compile_for_hopper, global_accesses
    from transfer_strategies import digest_kernel

    fn = getattr(digest_kernel, kernel)
    pointers = {"base": "*i32", "words": "*i32", "piece_offsets": "*i64", "ids": "*i64", "out": "*i64"}
    constexprs = {"ROW_WORDS": 64, "CHUNK": 1024, "PIECES": digest_kernel.PIECES, "ALIGN": 4}  # Llama-3-8B's bf16 rows
    divisible = {"block_words", "head_words", "stride_h", "stride_t", "n_words"}
    compiled = compile_for_hopper(fn, pointers, constexprs, divisible)
    assert "atom.global" in compiled.asm["ptx"]
    accesses = global_accesses(compiled)
    assert accesses["ld.global.v4.b32"] and not accesses["ld.global.b32"]
