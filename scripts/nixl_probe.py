"""How fast transport=nixl carries one payload on this machine before any engine runs: its two
buffers (transfer_strategies/transport/nixl.py: the decode worker's NixlStaging, the prefill
worker's NixlMirror writing into it) in one process, with UCX restricted by the environment the
way the harness restricts it for a link (UCX_TLS, UCX_NET_DEVICES). One payload of --mib at a
time, --repeat times; with --host-buffers on a GPU through pinned host memory, as across a link
(transport.buffer_device=cpu), the copy onto the receiver's GPU included.

    UCX_TLS=tcp,cuda_copy UCX_NET_DEVICES=lo python scripts/nixl_probe.py --device cuda --mib 1024
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from transfer_strategies.transport.nixl import NixlMirror, NixlStaging  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--host-buffers", action="store_true", help="on a GPU: NIXL between pinned host buffers")
    p.add_argument("--timeout-s", type=float, default=120.0)
    args = p.parse_args()
    dev = torch.device(args.device)
    nbytes = args.mib << 20
    receiver = NixlStaging(dev, nbytes, on_host=args.host_buffers and dev.type == "cuda")
    sender = NixlMirror(receiver.handle, dev)
    env = {k: v for k, v in os.environ.items() if k.startswith("UCX_")}
    print(f"device={args.device} host_buffers={args.host_buffers} bytes={nbytes} env={env}")
    seconds = []
    for i in range(args.repeat):
        mark = i % 255 + 1  # a new value each time: a write that did not land leaves the last one
        sender.tensor.fill_(mark)
        if dev.type == "cuda":
            torch.cuda.synchronize()  # the payload written, as the sender waits for its event
        t0 = time.perf_counter()
        sender.deliver(0, nbytes, args.timeout_s)
        receiver.arrived(0, nbytes)  # onto the receiver's GPU, where it landed in host memory
        seconds.append(time.perf_counter() - t0)
        ok = bool((receiver.tensor == mark).all())
        print(f"write {i}: {seconds[-1] * 1e3:.1f} ms, {nbytes * 8 / seconds[-1] / 1e9:.2f} Gbit/s, intact={ok}")
    med = statistics.median(seconds)
    print(f"median {med * 1e3:.1f} ms, {nbytes * 8 / med / 1e9:.2f} Gbit/s over {args.repeat} writes")


if __name__ == "__main__":
    main()
