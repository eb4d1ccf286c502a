"""vLLM's own connectors, unchanged, started on vLLM's CPU build where one call at start-up assumes
an accelerator. vLLM loads them through kv_connector_module_path (a strategy YAML's `cpu_module`,
on the CPU only); everything but that call is vLLM's.

MooncakeConnector: its worker asks torch for the current accelerator's index before it starts
Mooncake's transfer engine (to keep the CUDA device that MNNVL's allocator may change), and
torch's CPU build raises, having none. The index goes only to current_platform.set_device, which
does nothing on the CPU; while the connector is built, index 0 is the answer."""

from __future__ import annotations

import contextlib

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector import (
    MooncakeConnector as VllmMooncakeConnector,
)


@contextlib.contextmanager
def accelerator_index_zero():
    """torch.accelerator.current_device_index() answers 0 where torch has no accelerator."""
    if torch.accelerator.is_available():
        yield
        return
    original = torch.accelerator.current_device_index
    torch.accelerator.current_device_index = lambda: 0
    try:
        yield
    finally:
        torch.accelerator.current_device_index = original


class MooncakeConnector(VllmMooncakeConnector):
    def __init__(self, *args, **kwargs):
        with accelerator_index_zero():
            super().__init__(*args, **kwargs)
