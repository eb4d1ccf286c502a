"""The transport faults and the arrival checks, without engines."""

import pytest
import torch

from transfer_strategies.faults import FaultInjector, check_message, header, payload_checksum
from transfer_strategies.transport.message import Message, as_bytes


def message(payload: torch.Tensor, meta: dict) -> Message:
    return Message("t", 0, 1, as_bytes(payload), meta, 0.0, 0.0)


def test_every_nth_transfer_is_faulted():
    f = FaultInjector({"kind": "drop", "every": 3}, timeout_s=5)
    assert [f.pick() for _ in range(7)] == [None, None, "drop", None, None, "drop", None]
    assert FaultInjector(None, 5).pick() is None
    assert FaultInjector({"kind": "delay"}, timeout_s=5).delay_s == 7  # past the timeout by default
    with pytest.raises(ValueError, match="unknown fault"):
        FaultInjector({"kind": "lose"}, 5)


def test_a_truncated_payload_is_caught_by_its_length():
    payload = torch.randn(64)
    meta = header(payload, checksums=False)
    sent = FaultInjector.damage("truncate", payload, 0, 1, own_copy=True)
    assert "truncated: 128 of 256 bytes" in check_message(message(sent, meta))
    assert check_message(message(payload, meta)) is None


@pytest.mark.parametrize("n", [1, 5, 64, 1001])
def test_any_single_flipped_bit_changes_the_checksum(n):
    gen = torch.Generator().manual_seed(n)
    data = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen)
    want = payload_checksum(data)
    for i in range(n):
        for bit in (0, 3, 7):
            flipped = data.clone()
            flipped[i] ^= 1 << bit
            assert payload_checksum(flipped) != want, (i, bit)
    assert payload_checksum(data, chunk=7) == want  # chunking does not change it


def test_a_flip_leaves_a_payload_it_does_not_own_alone():
    """full_cache posts its KV cache's own tensors: the flip goes into a copy."""
    kv_layer = torch.randn(32)
    before = kv_layer.clone()
    meta = header(kv_layer, checksums=True)
    sent = FaultInjector.damage("flip", kv_layer, 2, 3, own_copy=False)
    assert torch.equal(kv_layer, before)
    assert "checksum differs" in check_message(message(sent, meta))
    assert FaultInjector.damage("flip", kv_layer, 1, 3, own_copy=False) is kv_layer  # only the last message
