"""Shared helpers: run the real harness on the configuration `python -m harness <overrides>`
composes: in this process (`run_harness`: no interpreter, Hydra and vLLM import per run, and
engines and instances forked from a server that imported vLLM already; the offline runner's
engines an earlier run of the session kept are reused where their configuration is the same,
harness/offline/engine_pool.py), or in a subprocess as a user would (a run that needs its own
environment, the command line's contract); configurations it must refuse before any engine
starts: `refused_in_process`.

Engine start-up dominates test time, so each harness run is a module-scoped fixture whose
results several tests read. What else several test modules share is in tests/helpers.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from harness import resolvers

ROOT = Path(__file__).resolve().parent.parent
resolvers.register()  # as harness/startup.py does
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # as harness/startup.py does (the engines inherit it)
# the checks in tests/helpers assert as a test module does: rewritten by pytest, a failure shows the
# values compared (registered before any test module imports them)
pytest.register_assert_rewrite("tests.helpers")


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
                device: str = "cpu", subprocess_only: bool = False) -> HarnessRun:
    """`python -m harness hydra.run.dir=<run_dir> device=<device> <overrides>`: in this process
    (the offline runner's engines reused where they can be), unless it has an `env` of its own, a
    value only Hydra's runtime resolves, or subprocess_only: then in a subprocess (timeout: its
    limit)."""
    shutil.rmtree(run_dir, ignore_errors=True)  # records append: start each test run from nothing
    if env is None and not subprocess_only:
        # the session's runs alternate between a few configurations (the edge prompts' baseline, the
        # scenarios', full_cache's smaller cache): two sets of each kind kept alive, not one
        cfg = compose_config(f"device={device}", "run.keep_engine_sets=2", *overrides)
        # a value Hydra's runtime resolves (vllm_example's ${hydra:runtime.output_dir}) exists
        # only in a run from the command line
        if "${hydra:" not in OmegaConf.to_yaml(cfg):
            return run_in_process(cfg, run_dir)
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    cmd = [sys.executable, "-m", "harness", f"hydra.run.dir={run_dir}", f"device={device}", *overrides]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return HarnessRun(p.returncode, p.stdout, p.stderr, run_dir)


def compose_config(*overrides: str) -> DictConfig:
    """The configuration `python -m harness <overrides>` runs with (Hydra's compose API)."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def run_in_process(cfg: DictConfig, run_dir: Path) -> HarnessRun:
    """The runner's run (harness/offline/run.py, harness/serving/serve.py) on a composed config,
    its stdout and stderr captured."""
    if cfg.runner.name == "serve":
        from harness.serving.serve import run
    else:
        from harness.offline.run import run

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run(cfg, run_dir)
    return HarnessRun(code, out.getvalue(), err.getvalue(), run_dir)


def refused_in_process(run_dir: Path, *overrides: str, device: str = "cpu") -> HarnessRun:
    """What `python -m harness <overrides>` does with a configuration it must refuse, run in this
    process: the runner harness/__main__.py picks, on the composed config, its stdout and stderr
    captured. Starting an engine fails the test (a refusal comes before any). Hydra's command
    line and the process's exit code are proven once each by subprocess tests (test_bad_input.py)."""
    from harness.offline.deployment import OfflineDeployment
    from harness.serving.deployment import ServingDeployment

    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = compose_config(f"device={device}", *overrides)
    if cfg.runner.name == "serve":
        from harness.serving.serve import run
    else:
        from harness.offline.run import run

    def no_engines(*args, **kwargs):
        raise AssertionError(f"engines started for a configuration that should have been refused: {overrides}")

    out, err = io.StringIO(), io.StringIO()
    with mock.patch.object(OfflineDeployment, "start", no_engines), \
            mock.patch.object(ServingDeployment, "start", no_engines), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run(cfg, run_dir)
    return HarnessRun(code, out.getvalue(), err.getvalue(), run_dir)


FULL = pytest.mark.full  # make test-full only (tests/TIERS.md says what make test keeps of each matrix)
# seconds each without an engine (processes over gloo's TCP, Triton's interpreter, a subprocess that
# imports vLLM): make test runs them, make test-fast leaves them out
SLOW = pytest.mark.slow
TRANSPORT_KINDS = ["staged", pytest.param("gloo", marks=SLOW), "nixl"]  # gloo's TCP rendezvous takes seconds per test


def cells(values, kept, ids=None) -> list:
    """A matrix's cells as pytest params: those in `kept` run in make test, the others only in
    make test-full (marked full)."""
    return [pytest.param(v, marks=() if v in kept else FULL, id=ids(v) if ids else None) for v in values]


def write_token_prompts(path: Path, prompts: list[list[int]]) -> Path:
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return path


@pytest.fixture(scope="session")
def results_dir(tmp_path_factory) -> Path:
    """Where the tests' harness runs write: pytest's temporary directory (it keeps the last three
    sessions'), not the source tree; $HARNESS_TEST_RESULTS where the runs are wanted (scripts/gpu_run.sh
    check keeps the GPU tests' runs in results/tests/ to copy them out)."""
    if os.environ.get("HARNESS_TEST_RESULTS"):
        d = Path(os.environ["HARNESS_TEST_RESULTS"]).resolve()
        d.mkdir(parents=True, exist_ok=True)
        return d
    return tmp_path_factory.mktemp("results", numbered=False)
