"""link=veth: the prefill and decode engines across a shaped link the harness makes for the run
(harness/link.py). The shaping really applied (the measured ceiling within 10% of the set rate),
a strategy correct across it over gloo and NIXL, bad settings refused before anything is made, and nothing left
behind. Needs root and iproute2 (tc): skipped where either is missing."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.ceiling import link_ceiling_gbps
from harness.link import IFNAME, PREFILL_IP, LinkError, LinkSpec, VethLink
from tests.conftest import FULL, ROOT, cells, run_harness
from tests.helpers.runs import assert_bad_input

needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("tc") is None or shutil.which("ip") is None,
                                reason="a shaped link needs root and iproute2 (ip, tc)")


def namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def test_a_link_spec_is_checked_and_becomes_tbf_under_netem():
    assert LinkSpec(10).qdiscs() == [["root", "handle", "2:", "tbf", "rate", "10gbit", "burst", "5000000",
                                      "latency", "20ms"]]
    delayed = LinkSpec(1, 0.5).qdiscs()
    assert delayed[0][:5] == ["root", "handle", "1:", "netem", "delay"] and delayed[1][:2] == ["parent", "1:1"]
    assert LinkSpec().qdiscs() == []  # unshaped: the veth pair's own speed
    for bad in ({"rate_gbit": 0}, {"rate_gbit": -1}, {"delay_ms": -1}):
        with pytest.raises(LinkError):
            LinkSpec(**bad)


@needs_root
def test_a_link_is_shaped_to_its_rate_and_removed_after():
    before = namespaces()
    with VethLink(LinkSpec(1.0)) as link:
        assert set(link.netns.values()) <= namespaces()
        assert "tbf" in link.shown()["prefill"] and "tbf" in link.shown()["decode"]
        gbps = link_ceiling_gbps(PREFILL_IP, link.netns, IFNAME, nbytes=16 << 20)
    assert isinstance(gbps, float) and gbps == pytest.approx(1.0 / 8, rel=0.1), gbps
    assert namespaces() == before


def test_bad_link_settings_are_bad_input(tmp_path):
    assert_bad_input(run_harness(tmp_path / "a", "link=veth"), "link=veth needs transport=gloo")
    assert_bad_input(run_harness(tmp_path / "b", "link=veth", "transport=gloo", "link.rate_gbit=-1"),
                     "link.rate_gbit must be > 0")
    assert_bad_input(run_harness(tmp_path / "c", "link=veth", "transport=gloo", "transport.address=10.0.0.1:1"),
                     "leave run.netns and transport.address unset")
    assert_bad_input(run_harness(tmp_path / "d", "link=veth", "transport=gloo", "runner=serve"),
                     "runs with runner=offline")


@needs_root
@pytest.mark.engine
@pytest.mark.parametrize("transport", cells(["gloo", "nixl"], {"nixl"}))
def test_kv_crosses_links_of_two_speeds_bit_for_bit_on_engines_started_once(tmp_path, transport):
    """A sweep across two link speeds, as docs/transports.md shows it: over gloo's TCP, and over NIXL told
    the link (UCX would take shared memory, which no link carries: a KV of 4 MiB a request then
    moves at several GB/s, not at the link's 0.25). The second run takes the first one's engines
    and link, reshaped: each run's measured ceiling is its own set rate, and once the sweep's
    process has ended its namespaces are gone."""
    before = namespaces()
    cmd = [sys.executable, "-m", "harness", "-m", f"hydra.sweep.dir={tmp_path}", "device=cpu", "link=veth",
           "link.rate_gbit=2,1", f"transport={transport}", "workload=synthetic", "workload.prompt_len=1024",
           "workload.num_prompts=4"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    runs = sorted((d for d in tmp_path.iterdir() if (d / "summary.json").exists()), key=lambda d: int(d.name[0]))
    assert len(runs) == 2
    for rate, run_dir in zip((2.0, 1.0), runs, strict=True):
        s = json.loads((run_dir / "summary.json").read_text())
        assert s["status"] == "ok" and s["match_rate"] == 1.0 and s["digest_failures"] == 0 and s["digest_checked"] == 4
        assert s["link"] == {"kind": "veth", "rate_gbit": rate, "delay_ms": 0.0}
        assert s["link_ceiling_gbps"] == pytest.approx(rate / 8, rel=0.1)  # measured across the shaped link
        # no faster than the link (its token bucket lets the first 4 ms of bytes through at once)
        rows = [json.loads(x) for x in (run_dir / "requests.jsonl").read_text().splitlines()]
        rates = [r["bytes"] / r["transfer_ms"] / 1e6 for r in rows]
        assert len(rates) == 4 and max(rates) < 1.5 * s["link_ceiling_gbps"], rates
        assert s["engines_reused"] == dict.fromkeys(("baseline", "prefill", "decode"), rate == 1.0), s["engines_reused"]
    assert namespaces() == before  # the link's namespaces, veth pair and qdiscs went with the last engines


@needs_root
@pytest.mark.engine
def test_a_run_terminated_while_its_engines_start_removes_its_link(tmp_path):
    """SIGTERM (a scheduler's, timeout's) ends a run as Ctrl-C does: exit 130, status interrupted,
    engines stopped, the link's namespaces gone (the default action left them behind)."""
    before = namespaces()
    cmd = [sys.executable, "-m", "harness", f"hydra.run.dir={tmp_path}", "device=cpu", "link=veth", "link.rate_gbit=1",
           "transport=gloo"]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "engines.json").exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert namespaces() > before and p.poll() is None  # the link is up, its engines starting
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, out[-3000:]
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "interrupted"
    pids = list(json.loads((tmp_path / "engines.json").read_text()).values())
    assert pids and not any(Path(f"/proc/{pid}").exists() for pid in pids)
    assert namespaces() == before


@needs_root
@pytest.mark.engine
@FULL
def test_the_gpu_machines_link_recipe_runs_on_the_cpu(tmp_path):
    """`bash scripts/gpu_run.sh links` (issue 29's GPU table) with EXPERIMENT=cpu_bench: both of its
    multiruns (the same machine; links of two speeds on one strategy's engines) and the link
    report over them, as the GPU machine runs it."""
    before = namespaces()
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", RUNS=str(tmp_path / "runs"),
               OUT=str(tmp_path / "out"), EXPERIMENT="cpu_bench", STRATEGIES="fused", LENGTHS="256,1024",
               PER_LENGTH="2", RATES="2,1", CHUNK="256")
    p = subprocess.run(["bash", "scripts/gpu_run.sh", "links"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    report = (tmp_path / "out" / "links-link_report.md").read_text()
    for length in (256, 1024):
        for link in ("same machine", "2 Gbit/s", "1 Gbit/s"):
            assert f"| {length} | {link} |" in report, report
    assert (tmp_path / "out" / "links-runs.tgz").stat().st_size > 0
    reused = [json.loads((d / "summary.json").read_text())["engines_reused"]
              for d in sorted((tmp_path / "runs" / "links" / "links").glob("[0-9]_*"))]
    assert [r["prefill"] and r["decode"] for r in reused] == [False, True]
    assert namespaces() == before
