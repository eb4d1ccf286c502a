"""The negative control damages the KV after the strategy's own receive, and only what arrived."""

import torch

from tests.helpers.kv import make_kv
from transfer_strategies.digests import BlockDigests
from transfer_strategies.negative_control import corrupt_received
from transfer_strategies.scheduler import TransferRequest


def test_the_first_received_block_of_the_last_layer_changes_and_nothing_else():
    kv = make_kv(1)
    before = [t.clone() for t in kv.layers]
    digests = BlockDigests(kv)  # this cache has no head axis: one digest per block, under "all"
    digest = lambda ids: digests(ids)["all"]  # noqa: E731
    ids = [9, 4, 6]
    sent = digest(ids)
    corrupt_received(kv, TransferRequest("t", "r", ids, num_tokens=90, skip_blocks=1))
    assert digest(ids) == [sent[0], digest(ids)[1], sent[2]] and digest(ids)[1] != sent[1]
    changed = [not torch.equal(a, b) for a, b in zip(before, kv.layers)]
    assert changed == [False, False, True]
    assert torch.equal(kv.layers[2].select(1, 4), -before[2].select(1, 4))


def test_a_request_served_from_the_prefix_cache_is_left_alone():
    kv = make_kv(0)
    before = [t.clone() for t in kv.layers]
    corrupt_received(kv, TransferRequest("t", "r", [1, 2], num_tokens=40, skip_blocks=2))
    assert all(torch.equal(a, b) for a, b in zip(before, kv.layers))
