"""The transport faults (which requests carry one, what each does to a payload) and the arrival
checks, without engines."""

import pytest
import torch
from omegaconf import OmegaConf

from harness.offline.deployment import handoff_params
from harness.scenario import fault_for
from harness.workload import Prompt
from transfer_strategies.faults import check_message, checksum_hex, damage, header, payload_checksum, payload_sum
from transfer_strategies.kv_transfer_params import fault_of
from transfer_strategies.transport.message import Message, as_bytes


def message(payload: torch.Tensor, meta: dict) -> Message:
    return Message("t", 0, 1, as_bytes(payload), meta, 0.0, 0.0)


def test_every_nth_prompt_carries_the_scenarios_fault_and_the_warm_up_none():
    cfg = OmegaConf.create({"scenario": {"fault": {"kind": "drop", "every": 3}}, "run": {"transfer_timeout_s": 5}})
    picked = [fault_for(cfg, Prompt(i, [1])) for i in range(-1, 7)]
    assert picked == [None, None, None, {"kind": "drop", "delay_s": 7.0}, None, None,
                      {"kind": "drop", "delay_s": 7.0}, None]  # indices 2 and 5; delay_s: past the timeout
    cfg.scenario.fault = {"kind": "delay", "delay_s": 1.5}  # every 2nd by default
    assert [fault_for(cfg, Prompt(i, [1])) for i in range(4)] == [None, {"kind": "delay", "delay_s": 1.5}] * 2
    assert fault_for(OmegaConf.create({"scenario": {}, "run": {}}), Prompt(1, [1])) is None


def test_the_prefill_request_carries_the_fault_and_its_scheduler_side_reads_it():
    strategy = OmegaConf.create({"name": "fused", "handoff": "push"})
    prefill = handoff_params(strategy, "prefill", "t-1", None, fault={"kind": "flip", "delay_s": 7.0})
    decode = handoff_params(strategy, "decode", "t-1", None, fault={"kind": "flip", "delay_s": 7.0})
    assert fault_of(prefill) == ("flip", 7.0) and fault_of(decode) == (None, None)  # the sender injects it
    assert fault_of(handoff_params(strategy, "prefill", "t-2", None)) == (None, None)


def test_a_truncated_payload_is_caught_by_its_length():
    payload = torch.randn(64)
    meta = header(payload, checksums=False)
    sent = damage("truncate", payload, 0, 1, own_copy=True)
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
    assert checksum_hex(int(payload_sum(data, chunk=7))) == want  # chunking does not change it


def test_a_flip_leaves_a_payload_it_does_not_own_alone():
    """full_cache posts its KV cache's own tensors: the flip goes into a copy."""
    kv_layer = torch.randn(32)
    before = kv_layer.clone()
    meta = header(kv_layer, checksums=True)
    sent = damage("flip", kv_layer, 2, 3, own_copy=False)
    assert torch.equal(kv_layer, before)
    assert "checksum differs" in check_message(message(sent, meta))
    assert damage("flip", kv_layer, 1, 3, own_copy=False) is kv_layer  # only the last message
