"""The staged channel on CUDA (CUDA IPC staging buffer), between two processes as the engines'
workers are: on one GPU, and from one GPU into another's buffer when there are two; and NIXL's
(transport=nixl: the staging buffer registered as VRAM, or through pinned host buffers as across a
link: nixl-host) where NIXL is installed."""

import pytest
import torch

from tests.helpers.transport import check_messages_arrive, check_staging_pressure

pytestmark = pytest.mark.gpu

PAIRS = [("cuda:0", "cuda:0"), ("cuda:0", "cuda:1")]  # (sender, receiver)


def _need(devices):
    if not torch.cuda.is_available() or torch.cuda.device_count() <= max(torch.device(d).index for d in devices):
        pytest.skip(f"needs GPUs {devices}")


@pytest.mark.parametrize("kind", ["staged", "nixl", "nixl-host"])
@pytest.mark.parametrize("devices", PAIRS, ids=["one-gpu", "two-gpus"])
def test_messages_arrive_whole_and_in_place(devices, kind, tmp_path):
    _need(devices)
    if kind.startswith("nixl"):
        pytest.importorskip("nixl._api", reason="NIXL is not installed (on the GPU machine: .gpu's NIXL wheels)")
    check_messages_arrive(tmp_path, kind, devices)


@pytest.mark.parametrize("kind", ["staged", "nixl-host"])
@pytest.mark.parametrize("devices", PAIRS, ids=["one-gpu", "two-gpus"])
def test_more_than_the_buffer_holds_arrives_before_the_receiver_uses_any(devices, kind, tmp_path):
    _need(devices)
    if kind != "staged":
        pytest.importorskip("nixl._api", reason="NIXL is not installed (on the GPU machine: .gpu's NIXL wheels)")
    check_staging_pressure(tmp_path, devices, kind)
