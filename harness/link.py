"""A link of a chosen speed and latency between the prefill and decode engines, on one machine:
two Linux network namespaces joined by a veth pair, each end's egress shaped by the kernel's
traffic control (`tc`: tbf for the rate, netem for a delay), so that the KV crosses a network
interface as between two hosts (transport=gloo over TCP). Made before the run's engines start and removed
once nothing uses it, whatever happened: the namespaces go with the veth pair and its qdiscs.

A link is held by the run that made it and by the prefill/decode engines started in its
namespaces; the last hold given back removes it. With run.reuse_engines the engines outlive their
run (harness/offline/engine_pool.py) and so does their link: the next run of the process takes it,
shaped to its own settings (`tc qdisc` replaced on both ends), and with it the kept engines, so a
sweep across link speeds (`-m link.rate_gbit=10,5`) starts each strategy's engines once.

    python -m harness link=veth link.rate_gbit=10 link.delay_ms=0.5 transport=gloo

The run's summary keeps the link's settings (`link`) beside its measured ceiling
(`link_ceiling_gbps`, one large message over the shaped link before the engines start): a
machine that cannot push the set rate shows it there, and every figure is against that ceiling.
Needs root (CAP_NET_ADMIN) and iproute2.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from dataclasses import dataclass

PREFILL_IP, DECODE_IP = "10.78.0.1", "10.78.0.2"
IFNAME = "kv0"  # one name on both sides: one transport.ifname
PORT = 29700
_serial = itertools.count()


class LinkError(Exception):
    """The link could not be made (bad settings, no root, no iproute2): the run's bad input."""


@dataclass(frozen=True)
class LinkSpec:
    rate_gbit: float | None = None  # None: the veth pair's own speed, unshaped
    delay_ms: float = 0.0  # one way, added on each end's egress (a round trip pays it twice)

    def __post_init__(self):
        if self.rate_gbit is not None and not self.rate_gbit > 0:
            raise LinkError(f"link.rate_gbit must be > 0 (or null: unshaped), got {self.rate_gbit}")
        if not self.delay_ms >= 0:
            raise LinkError(f"link.delay_ms must be >= 0, got {self.delay_ms}")

    def summary(self) -> dict:
        return {"kind": "veth", "rate_gbit": self.rate_gbit, "delay_ms": self.delay_ms}

    def qdiscs(self) -> list[list[str]]:
        """The tc qdiscs of one end, root first: netem for the delay (where asked), tbf for the
        rate below it. tbf's bucket holds 4 ms at the rate (at least 64 KiB: a few TSO segments)
        and its queue 20 ms, so that neither the bucket nor the queue drops TCP into slow start."""
        out, parent = [], ["root"]
        if self.delay_ms > 0:
            out.append([*parent, "handle", "1:", "netem", "delay", f"{self.delay_ms:g}ms", "limit", "100000"])
            parent = ["parent", "1:1"]
        if self.rate_gbit is not None:
            rate = self.rate_gbit * 1e9 / 8  # bytes a second
            out.append([*parent, "handle", "2:", "tbf", "rate", f"{self.rate_gbit:g}gbit",
                        "burst", str(max(64 << 10, int(rate * 0.004))), "latency", "20ms"])
        return out


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode:
        raise LinkError(f"ip {' '.join(args)}: {done.stderr.strip()}")


class VethLink:
    """Two namespaces (prefill's, decode's) and the shaped veth pair between them. As a context
    manager: made on entering, removed on leaving. Held (hold/release): removed when the last hold
    is given back."""

    def __init__(self, spec: LinkSpec):
        self.spec = spec
        tag = f"{os.getpid() % 100000}x{next(_serial)}"  # a run's own: no engine of another run is in it
        self.netns = {"prefill": f"kvlp{tag}", "decode": f"kvld{tag}"}
        self.made: list[str] = []
        self.holders = 0

    def __enter__(self) -> VethLink:
        return self.make()

    def __exit__(self, *exc) -> None:
        self.remove()

    def make(self) -> VethLink:
        if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
            raise LinkError("link=veth makes network namespaces and shapes them: it needs root and iproute2 (ip, tc)")
        try:
            ends = []
            for role, addr in (("prefill", PREFILL_IP), ("decode", DECODE_IP)):
                _ip("netns", "add", self.netns[role])
                self.made.append(self.netns[role])
                ends.append((f"{self.netns[role]}v", self.netns[role], addr))
            _ip("link", "add", ends[0][0], "type", "veth", "peer", "name", ends[1][0])
            for end, ns, addr in ends:
                _ip("link", "set", end, "netns", ns)
                _ip("-n", ns, "link", "set", end, "name", IFNAME)
                _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", IFNAME)
                _ip("-n", ns, "link", "set", IFNAME, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                self._shape(ns)
        except BaseException:
            self.remove()
            raise
        return self

    def _shape(self, ns: str) -> None:
        for qdisc in self.spec.qdiscs():
            done = subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", IFNAME, *qdisc],
                                  capture_output=True, text=True)
            if done.returncode:
                why = done.stderr.strip()
                if "unknown" in why and "netem" in qdisc:
                    why = "this kernel has no netem qdisc (sch_netem), which a delay needs: " + why
                raise LinkError(f"tc qdisc add dev {IFNAME} {' '.join(qdisc)}: {why}")

    def reshape(self, spec: LinkSpec) -> None:
        """Both ends shaped as spec instead (the engines on either side stay)."""
        self.spec = spec
        for ns in self.netns.values():
            # an unshaped end has no root qdisc of ours: nothing to delete
            subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", IFNAME, "root"], capture_output=True)
            self._shape(ns)

    def hold(self) -> VethLink:
        self.holders += 1
        return self

    def release(self) -> None:
        self.holders -= 1
        if self.holders <= 0:
            self.remove()

    def remove(self) -> None:
        for ns in self.made:  # the veth pair and its qdiscs go with them
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.made = []
        if self in _shared:
            _shared.remove(self)

    def shown(self) -> dict[str, str]:
        """What tc reports on each end (the shaping as applied)."""
        return {role: subprocess.run(["tc", "-n", ns, "qdisc", "show", "dev", IFNAME], capture_output=True,
                                     text=True).stdout.strip() for role, ns in self.netns.items()}


_shared: list[VethLink] = []  # made with share=True and not yet removed (at most one)


def open_link(spec: LinkSpec, share: bool) -> VethLink:
    """A link shaped as spec, held once by the caller (release() it). With share, the one an
    earlier run of this process left held by its kept engines, where there is one, reshaped."""
    if share and _shared:
        link = _shared[0]
        link.reshape(spec)
        return link.hold()
    link = VethLink(spec).make()
    if share:
        _shared.append(link)
    return link.hold()


def link_for(cfg) -> LinkSpec | None:
    """The run's link (link=veth), not yet made; None for none. Its settings checked first: a
    bad one is the run's bad input, before anything is made."""
    if cfg.link.kind == "none":
        return None
    if cfg.link.kind != "veth":
        raise LinkError(f"link.kind must be none or veth, got {cfg.link.kind!r}")
    if cfg.transport.kind not in ("gloo", "nixl"):
        raise LinkError("link=veth needs transport=gloo or nixl: the KV must cross the link as TCP "
                        "(transport=staged shares the machine's memory, which no link carries)")
    netns = cfg.run.get("netns") or {}
    if cfg.transport.get("address") or any(netns.get(r) for r in ("prefill", "decode")):
        raise LinkError("link=veth makes its own namespaces and address: leave run.netns and transport.address unset")
    return LinkSpec(None if cfg.link.rate_gbit is None else float(cfg.link.rate_gbit), float(cfg.link.delay_ms))


def apply(cfg, link: VethLink) -> None:
    """Put the run's engines on either side of the link (run.netns, transport.address, .ifname)."""
    from omegaconf import open_dict

    with open_dict(cfg):
        cfg.run.netns = dict(link.netns)
        cfg.transport.address, cfg.transport.ifname = f"{PREFILL_IP}:{PORT}", IFNAME
