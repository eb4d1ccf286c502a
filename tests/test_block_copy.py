"""Gather and scatter of KV blocks against plain indexing, for the layouts vLLM's backends use
(block axis first on CPU, after a K/V axis on GPU) and for block ids with and without runs."""

import pytest
import torch

from transfer_strategies.base import TransferConnector, TransferRequest, block_runs, in_memory_order


def _connector(kv: torch.Tensor, block_dim: int) -> TransferConnector:
    c = TransferConnector.__new__(TransferConnector)  # the copy helpers need only the KV tensors
    c.kv_layers, c.block_dim, c.device, c.corrupt = [kv], block_dim, kv.device, False
    return c


def test_block_runs():
    assert block_runs([]) == []
    assert block_runs([4, 5, 6, 9, 3, 4]) == [(4, 3), (9, 1), (3, 2)]


@pytest.mark.parametrize("block_dim", [0, 1])
@pytest.mark.parametrize("ids", [[7], [3, 4, 5, 6, 7, 8, 9, 10], [3, 4, 5, 20, 21, 0, 1, 2, 30],
                                 [9, 2, 14, 5, 11, 0, 7, 3, 12, 1]])
def test_gather_and_scatter_match_indexing(block_dim, ids):
    shape = [32, 4, 3, 8] if block_dim == 0 else [2, 32, 4, 3]
    kv = torch.randn(shape)
    c = _connector(kv, block_dim)
    idx = torch.tensor(ids)
    got = c.gather(0, ids)
    assert torch.equal(got, kv.index_select(block_dim, idx))

    into = torch.zeros_like(kv)
    d = _connector(into, block_dim)
    req = TransferRequest("t", "r", block_ids=ids, num_tokens=0, skip_blocks=1)
    d.scatter(req, 0, got)
    want = torch.zeros_like(kv)
    want.index_copy_(block_dim, idx[1:], got.narrow(block_dim, 1, len(ids) - 1))
    assert torch.equal(into, want)  # the first block (a prefix-cache hit) left alone


@pytest.mark.parametrize("block_dim", [0, 1])
@pytest.mark.parametrize("ids", [[], [3, 4, 5, 6, 7, 8, 9, 10], [9, 2, 14, 5, 11, 0, 7, 3, 12, 1]])
@pytest.mark.parametrize("skip", [0, 2])
def test_all_layers_at_once_match_layer_by_layer(block_dim, ids, skip):
    shape = [32, 4, 3, 8] if block_dim == 0 else [2, 32, 4, 3]
    src = _connector(torch.randn(shape), block_dim)
    src.kv_layers = [torch.randn(shape) for _ in range(3)]
    src._set_pieces()
    out = torch.empty(3, *src.layer_shape(len(ids)))
    src.gather_layers(ids, out)
    for layer in range(3):
        assert torch.equal(out[layer], src.gather(layer, ids))

    dst = _connector(torch.zeros(shape), block_dim)
    dst.kv_layers = [torch.zeros(shape) for _ in range(3)]
    dst._set_pieces()
    req = TransferRequest("t", "r", block_ids=ids, num_tokens=0, skip_blocks=skip)
    dst.scatter_layers(req, out)
    for layer in range(3):
        want = torch.zeros(shape)
        if ids:
            want.index_copy_(block_dim, torch.tensor(ids[skip:]), out[layer].narrow(block_dim, skip, len(ids) - skip))
        assert torch.equal(dst.kv_layers[layer], want)


def test_in_memory_order_undoes_a_permuted_allocation():
    raw = torch.randn(32, 2, 4, 3)  # allocated blocks first, handed out as [2, blocks, ...]
    handed_out = raw.permute(1, 0, 2, 3)
    view = in_memory_order(handed_out)
    assert view.is_contiguous() and view.shape == raw.shape and view.data_ptr() == raw.data_ptr()


def _layers(block_dim: int, n_layers: int = 3, blocks: int = 32, fill=torch.randn):
    shape = [blocks, 4, 3, 8] if block_dim == 0 else [2, blocks, 4, 3]
    c = _connector(torch.zeros(shape), block_dim)
    c.kv_layers = [fill(shape) for _ in range(n_layers)]
    c._set_pieces()
    return c


@pytest.mark.parametrize("batched", [True, False])  # False: a layout whose pieces are not contiguous
@pytest.mark.parametrize("block_dim", [0, 1])
def test_digests_follow_block_contents_not_block_ids(block_dim, batched):
    src = _layers(block_dim)
    ids = [3, 4, 5, 20, 21, 9]
    src._batched = batched
    sent = src.block_digests(ids)
    assert len(set(sent)) == len(ids)  # different contents, different digests

    dst = _layers(block_dim, fill=torch.zeros)  # the same blocks under other ids, as a receiver holds them
    other = [10, 11, 0, 1, 2, 30]
    for layer in range(3):
        dst.kv_layers[layer].index_copy_(block_dim, torch.tensor(other),
                                         src.kv_layers[layer].index_select(block_dim, torch.tensor(ids)))
    dst._batched = batched
    assert dst.block_digests(other) == sent
    assert src.block_digests([]) == []


@pytest.mark.parametrize("block_dim", [0, 1])
def test_digests_see_one_flipped_bit_and_swapped_blocks_or_words(block_dim):
    c = _layers(block_dim)
    ids = [5, 6, 7, 12]
    before = c.block_digests(ids)

    raw = c.kv_layers[2].view(torch.int32)  # one bit in the last layer, in block 7
    raw[(1, 7, 2, 1) if block_dim == 1 else (7, 2, 1, 0)] ^= 1 << 30
    after = c.block_digests(ids)
    assert [a != b for a, b in zip(before, after)] == [False, False, True, False]

    c = _layers(block_dim)
    before = c.block_digests(ids)
    layer = c.kv_layers[0]
    a, b = layer.select(block_dim, 5).clone(), layer.select(block_dim, 6).clone()
    layer.select(block_dim, 5).copy_(b)
    layer.select(block_dim, 6).copy_(a)
    swapped = c.block_digests(ids)
    assert swapped[0] != before[0] and swapped[1] != before[1] and swapped[2:] == before[2:]

    c = _layers(block_dim)
    before = c.block_digests(ids)
    layer = c.kv_layers[1]
    block = (layer[12] if block_dim == 0 else layer[0, 12]).view(-1)  # two words of one block trade places
    block[[0, 1]] = block[[1, 0]].clone()
    assert c.block_digests(ids)[3] != before[3]


def test_digest_products_wrap_around_rather_than_saturate():
    big = torch.tensor([2**31 - 1, -(2**31)], dtype=torch.int32)
    w = torch.tensor([3, 5], dtype=torch.int32)
    assert torch.mul(big, w).tolist() == [2**31 - 3, -(2**31)]
