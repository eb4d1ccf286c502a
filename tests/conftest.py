"""Shared helpers: run the real harness (`python -m harness`) as a user would, in a subprocess.

Engine start-up dominates test time, so each harness run is a module-scoped fixture whose
results several tests read.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class HarnessRun:
    code: int
    stdout: str
    stderr: str
    run_dir: Path

    def jsonl(self, name: str) -> list[dict]:
        p = self.run_dir / name
        return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []

    @property
    def summary(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text())


def run_harness(run_dir: Path, *overrides: str, timeout: float = 900, env: dict | None = None,
                device: str = "cpu") -> HarnessRun:
    shutil.rmtree(run_dir, ignore_errors=True)  # records append: start each test run from nothing
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    cmd = [sys.executable, "-m", "harness", f"hydra.run.dir={run_dir}", f"device={device}", *overrides]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return HarnessRun(p.returncode, p.stdout, p.stderr, run_dir)


def write_token_prompts(path: Path, prompts: list[list[int]]) -> Path:
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return path


@pytest.fixture(scope="session")
def results_dir() -> Path:
    d = ROOT / "results" / "tests"
    d.mkdir(parents=True, exist_ok=True)
    return d
