"""The block copy engine (gather/scatter of KV blocks) against plain indexing, for the layouts
vLLM's backends use (block axis first on CPU, after a K/V axis on GPU), for block ids with and
without runs, and for any subset of layers."""

import pytest
import torch

from tests.helpers.kv import NUM_BLOCKS, layer_shape, make_kv
from transfer_strategies.kv_blocks import KVBlocks, block_runs, in_memory_order

IDS = [[7], [3, 4, 5, 6, 7, 8, 9, 10], [3, 4, 5, 20, 21, 0, 1, 2, 30], [9, 2, 14, 5, 11, 0, 7, 3, 12, 1]]


def empty_for(kv: KVBlocks, n_blocks: int, n_layers: int) -> torch.Tensor:
    return torch.empty(n_layers, *kv.layer_shape(n_blocks), dtype=kv.dtype)


def test_block_runs():
    assert block_runs([]) == []
    assert block_runs([4, 5, 6, 9, 3, 4]) == [(4, 3), (9, 1), (3, 2)]


def test_the_block_axis_is_found_and_a_layer_has_one_piece_per_lead_index():
    kv = make_kv(1)
    assert kv.block_dim == 1 and kv.layer_shape(5) == [2, 5, 4, 3] and len(kv.pieces([0, 2])) == 4
    assert kv.block_bytes() == 2 * 4 * 3 * 4 and kv.cache_bytes() == 3 * NUM_BLOCKS * kv.block_bytes()
    with pytest.raises(RuntimeError, match="num_blocks=99"):
        KVBlocks({"l": torch.zeros(4, 5)}, 99)


@pytest.mark.parametrize("block_dim", [0, 1])
@pytest.mark.parametrize("ids", IDS)
@pytest.mark.parametrize("layers", [[0, 1, 2], [1], [2, 0]])
def test_gather_matches_indexing(block_dim, ids, layers):
    kv = make_kv(block_dim)
    out = kv.gather(ids, empty_for(kv, len(ids), len(layers)), layers)
    for j, layer in enumerate(layers):
        assert torch.equal(out[j], kv.layers[layer].index_select(block_dim, torch.tensor(ids)))


@pytest.mark.parametrize("block_dim", [0, 1])
@pytest.mark.parametrize("ids", IDS)
@pytest.mark.parametrize("layers", [[0, 1, 2], [1]])
def test_scatter_is_the_inverse_of_gather(block_dim, ids, layers):
    src = make_kv(block_dim)
    buf = src.gather(ids, empty_for(src, len(ids), len(layers)), layers)
    dst = make_kv(block_dim, fill=torch.zeros)
    other = [(b * 7 + 3) % NUM_BLOCKS for b in ids]  # the receiver holds them under other ids
    dst.scatter(other, buf, layers)
    for j, layer in enumerate(layers):
        want = torch.zeros(layer_shape(block_dim))
        want.index_copy_(block_dim, torch.tensor(other), buf[j])
        assert torch.equal(dst.layers[layer], want)


def test_plan_before_the_kv_exists_copies_what_is_there_when_run():
    kv = make_kv(0)
    out = empty_for(kv, 3, 3)
    copy = kv.gather_plan([4, 5, 6], out, range(3))
    for t in kv.layers:  # the forward pass writes the KV after the plan was made
        t.fill_(2.5)
    copy()
    assert torch.equal(out, torch.full_like(out, 2.5))


def test_non_contiguous_layouts_fall_back_to_indexed_copies():
    base = {f"l{i}": torch.randn(NUM_BLOCKS, 6, 8)[:, :, :4] for i in range(2)}  # every block strided
    kv = KVBlocks(base, NUM_BLOCKS)
    assert not kv.contiguous
    ids = [3, 4, 5, 9]
    out = kv.gather(ids, empty_for(kv, 4, 2), [0, 1])
    assert torch.equal(out[1], base["l1"][ids])
    dst = KVBlocks({f"l{i}": torch.zeros(NUM_BLOCKS, 6, 8)[:, :, :4] for i in range(2)}, NUM_BLOCKS)
    dst.scatter(ids, out, [0, 1])
    assert torch.equal(dst.layers[0][ids], base["l0"][ids])


def test_view_and_take_read_a_payload_as_blocks():
    kv = make_kv(1)
    whole = kv.view(kv.layers[2].contiguous().view(-1).view(torch.uint8), n_layers=1)
    assert list(whole.shape) == [1, *kv.layer_shape(NUM_BLOCKS)]
    picked = kv.take(whole, torch.tensor([5, 1]))
    assert torch.equal(picked[0], kv.layers[2].index_select(1, torch.tensor([5, 1])))
    assert list(kv.view(torch.empty(0, dtype=torch.uint8), 1).shape) == [1, *kv.layer_shape(0)]


def test_in_memory_order_undoes_a_permuted_allocation():
    raw = torch.randn(32, 2, 4, 3)  # allocated blocks first, handed out as [2, blocks, ...]
    view = in_memory_order(raw.permute(1, 0, 2, 3))
    assert view.is_contiguous() and view.shape == raw.shape and view.data_ptr() == raw.data_ptr()
