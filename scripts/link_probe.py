"""What a shaped link carries on this machine (harness/link.py, link=veth): for each rate, a veth
pair between two network namespaces shaped to it, and one large gloo message timed across it
(harness.ceiling.link_ceiling_gbps, as a run measures its link_ceiling_gbps), beside the set rate.
A rate the machine cannot push shows as a measured figure well below it. Needs root and iproute2.

    python scripts/link_probe.py --rates 0 0.5 1 5 10 20      # 0: unshaped
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from harness.ceiling import link_ceiling_gbps  # noqa: E402
from harness.link import IFNAME, PREFILL_IP, LinkSpec, VethLink  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", type=float, nargs="+", default=[0, 1, 10], help="Gbit/s; 0: unshaped")
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--mib", type=int, default=64, help="the message's size")
    args = ap.parse_args()
    print("| set Gbit/s | delay ms | measured Gbit/s | measured / set | qdisc (prefill's end) |")
    print("| --- | --- | --- | --- | --- |")
    for rate in args.rates:
        with VethLink(LinkSpec(rate or None, args.delay_ms)) as link:
            got = link_ceiling_gbps(PREFILL_IP, link.netns, IFNAME, nbytes=args.mib << 20)
            qdisc = link.shown()["prefill"].replace("\n", "; ")
        if isinstance(got, str):
            print(f"| {rate or 'unshaped'} | {args.delay_ms:g} | {got} | - | {qdisc} |")
            continue
        share = f"{got * 8 / rate:.2f}" if rate else "-"
        print(f"| {rate or 'unshaped'} | {args.delay_ms:g} | {got * 8:.2f} | {share} | {qdisc} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
