"""Sweeps (`python -m harness -m ...`) exit 1 when any job is not ok, through Hydra's own
launcher and through submitit's (`hydra/launcher=local`, the same launcher plugin as the Slurm
one). The jobs here are bad input: each runs the harness's checks in its job and stops before
any engine starts, so a sweep takes seconds while every step of launching is real."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from harness.report.sweep import SweepSummary

# each case is a `python -m harness` process that imports vLLM: seconds each, minutes in all
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def sweep(sweep_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "harness", "-m", f"hydra.sweep.dir={sweep_dir}", "device=cpu", *overrides]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def jobs(sweep_dir: Path) -> list[dict]:
    return json.loads((sweep_dir / "sweep_summary.json").read_text())


def test_a_sweep_with_a_failed_job_exits_1(tmp_path):
    p = sweep(tmp_path, "sampling.max_tokens=0,-1")
    assert p.returncode == 1, p.stderr[-2000:]
    assert [(j["overrides"], j["status"]) for j in jobs(tmp_path)] == [
        ("device=cpu sampling.max_tokens=0", "bad_input"), ("device=cpu sampling.max_tokens=-1", "bad_input")]
    assert "2 jobs, 2 not ok" in p.stdout and p.stderr.count("error: sampling.max_tokens") == 2


def test_a_two_job_sweep_through_submitit(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    p = sweep(tmp_path, "hydra/launcher=local", "sampling.max_tokens=0,-1")
    assert p.returncode == 1, p.stderr[-2000:]
    assert "Submitit 'local' sweep output dir" in p.stdout
    assert [j["status"] for j in jobs(tmp_path)] == ["bad_input", "bad_input"]
    # each job ran in a process of its own, which submitit logged
    logs = sorted((tmp_path / ".submitit").glob("*/*_log.err"))
    errors = sorted(line for log in logs for line in log.read_text().splitlines() if line.startswith("error:"))
    assert len(logs) == 2 and len(errors) == 2
    assert errors[0].endswith("got -1") and errors[1].endswith("got 0")


def _job(sweep_dir: Path, name: str, status: str) -> None:
    d = sweep_dir / name
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text(f"- strategy={name}\n")
    (d / "summary.json").write_text(json.dumps({"status": status, "strategy": name}))


@pytest.mark.parametrize("statuses,exits", [(["ok", "ok"], False), (["ok", "mismatch"], True),
                                            (["ok", "engine_failed"], True), ([], True)])
def test_the_sweep_summary_exits_1_unless_every_job_is_ok(tmp_path, statuses, exits, capsys):
    for i, status in enumerate(statuses):
        _job(tmp_path, f"{i}_job", status)
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    if exits:
        with pytest.raises(SystemExit) as e:
            SweepSummary().on_multirun_end(config)
        assert e.value.code == 1
    else:
        SweepSummary().on_multirun_end(config)
    assert (tmp_path / "sweep_summary.txt").exists()
    assert f"{len(statuses)} jobs" in capsys.readouterr().out
