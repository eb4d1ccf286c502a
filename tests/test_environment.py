"""The environments a figure comes from: the CUDA flavor's versions pinned (constraints-cuda.txt, what
the GPU runs use) and every run's meta.json saying what it ran on."""

import re

from harness.records.meta import versions
from tests.conftest import ROOT


def pins(path) -> dict[str, str]:
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[\w.+-]+", line) for line in lines), "name==version, one a line"
    return {name.lower().replace("_", "-"): v for name, v in (line.split("==") for line in lines)}


def test_the_cuda_flavor_pins_what_the_gpu_runs_use():
    cuda = pins(ROOT / "constraints-cuda.txt")
    assert (cuda["vllm"], cuda["torch"], cuda["triton"]) == ("0.26.0", "2.11.0", "3.6.0")
    assert 'cuda = ["vllm>=0.26,<0.33"]' in (ROOT / "pyproject.toml").read_text()  # the extra admits it
    bundle = pins(ROOT.parent / "shared" / "gpu" / "requirements-py312.txt") \
        if (ROOT.parent / "shared" / "gpu" / "requirements-py312.txt").exists() else {}
    assert all(cuda.get(name) == v for name, v in bundle.items()), "constraints-cuda.txt against the GPU bundle"


def test_a_runs_versions_name_vllm_torch_triton_and_the_code():
    v = versions("cpu")
    assert v["vllm"] and v["torch"] and v["triton"] and v["python"] and "gpu" not in v
    assert v["git_sha"] is None or re.fullmatch(r"[0-9a-f]{40}(-dirty)?", v["git_sha"])
