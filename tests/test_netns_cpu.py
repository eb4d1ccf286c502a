"""Across hosts, on one machine: the prefill and decode engines in two Linux network namespaces
joined by a veth pair (created and removed here, its addresses inside those namespaces only), so
the KV crosses a network interface through transport=gloo and transport.address, as between two
hosts. Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2: skipped where either is missing.
"""

import json
import os
import shutil
import subprocess

import pytest

from tests.conftest import FULL, run_harness
from tests.helpers.runs import assert_bad_input

pytestmark = pytest.mark.engine

PREFILL_IP, DECODE_IP = "10.77.0.1", "10.77.0.2"


def ip(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def two_hosts():
    """(prefill namespace, decode namespace), each with lo and one end of a veth pair, kv0, up."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    tag = os.getpid() % 100000
    names = (f"kvp{tag}", f"kvd{tag}")
    try:
        for n in names:
            ip("netns", "add", n)
        ip("link", "add", f"kv{tag}a", "type", "veth", "peer", "name", f"kv{tag}b")
        for end, n, addr in ((f"kv{tag}a", names[0], PREFILL_IP), (f"kv{tag}b", names[1], DECODE_IP)):
            ip("link", "set", end, "netns", n)
            ip("-n", n, "link", "set", end, "name", "kv0")  # one name on both sides: one transport.ifname
            ip("-n", n, "addr", "add", f"{addr}/24", "dev", "kv0")
            ip("-n", n, "link", "set", "kv0", "up")
            ip("-n", n, "link", "set", "lo", "up")
    except subprocess.CalledProcessError as e:
        for n in names:
            subprocess.run(["ip", "netns", "del", n], capture_output=True)
        pytest.skip(f"cannot create network namespaces here: {e.stderr.strip()}")
    yield names
    for n in names:  # the veth pair goes with them
        subprocess.run(["ip", "netns", "del", n], capture_output=True)


def sent_bytes(netns: str) -> int:
    return json.loads(ip("-n", netns, "-s", "-j", "link", "show", "kv0"))[0]["stats64"]["tx"]["bytes"]


def across(netns, port: int) -> list[str]:
    return ["transport=gloo", f"transport.address={PREFILL_IP}:{port}", "transport.ifname=kv0",
            f"run.netns.prefill={netns[0]}", f"run.netns.decode={netns[1]}"]


# the default tier crosses a link the harness makes (tests/test_link_cpu.py, the same run.netns path)
@pytest.mark.parametrize(("strategy", "p", "d"), [pytest.param("fused", 1, 1, marks=FULL),
                                                  pytest.param("per_request_blocks", 1, 2, marks=FULL)])
def test_kv_crosses_a_network_interface_between_namespaces(two_hosts, strategy, p, d, tmp_path):
    before = sent_bytes(two_hosts[0])
    run = run_harness(tmp_path / "r", f"strategy={strategy}", *across(two_hosts, 29650),
                      f"engines.prefill={{tensor_parallel_size:{p}}}", f"engines.decode={{tensor_parallel_size:{d}}}")
    assert run.code == 0, run.stderr[-3000:]
    s = run.summary
    assert s["status"] == "ok" and s["match_rate"] == 1.0 and s["digest_failures"] == 0 and s["digest_checked"] == 4
    assert isinstance(s["link_ceiling_gbps"], float) and s["link_ceiling_gbps"] > 0
    kv_bytes = sum(r["bytes"] for r in run.jsonl("requests.jsonl"))
    # every KV byte left through the prefill namespace's interface (with the link probe's 6 x 64 MiB)
    assert kv_bytes > 0 and sent_bytes(two_hosts[0]) - before >= kv_bytes + 6 * (64 << 20)


@pytest.mark.slow
def test_an_address_the_prefill_engine_cannot_listen_on_is_bad_input(two_hosts, tmp_path):
    bad = across(two_hosts, 29660)
    bad[1] = "transport.address=10.77.0.9:29660"
    assert_bad_input(run_harness(tmp_path / "a", *bad), "10.77.0.9 is not an address in network namespace")
    assert_bad_input(run_harness(tmp_path / "b", "transport=gloo", "transport.address=10.77.0.9:29660"),
                     "cannot listen on 10.77.0.9")
    assert_bad_input(run_harness(tmp_path / "c", "transport=gloo", "transport.address=10.77.0.1"),
                     "transport.address must be HOST:PORT")
    assert_bad_input(run_harness(tmp_path / "d", *across(("nope", two_hosts[1]), 29660)),
                     "run.netns.prefill=nope: no such network namespace")
