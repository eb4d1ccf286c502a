"""How fast NIXL writes one buffer to another on this machine, with UCX restricted by the
environment the way the harness restricts it for a link (UCX_TLS, UCX_NET_DEVICES): the ceiling
transport=nixl can reach before any engine runs. Two agents in one process, each with its own
buffer (GPU memory with --device cuda), one WRITE of --mib at a time, --repeat times.

    UCX_TLS=tcp,cuda_copy UCX_NET_DEVICES=lo python scripts/nixl_probe.py --device cuda --mib 1024
"""

import argparse
import os
import statistics
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--timeout-s", type=float, default=120.0)
    args = p.parse_args()
    from nixl._api import nixl_agent, nixl_agent_config

    dev = torch.device(args.device)
    nbytes = args.mib << 20
    mem, idx = ("VRAM", dev.index or 0) if dev.type == "cuda" else ("DRAM", 0)
    agents, bufs = [], []
    for name in ("probe-src", "probe-dst"):
        a = nixl_agent(f"{name}-{os.getpid()}", nixl_agent_config(enable_prog_thread=False, backends=["UCX"]))
        b = torch.full((nbytes,), 7 if name == "probe-src" else 0, dtype=torch.uint8, device=dev)
        a.register_memory(b)
        agents.append(a)
        bufs.append(b)
    src, dst = agents
    peer = src.add_remote_agent(dst.get_agent_metadata())
    env = {k: v for k, v in os.environ.items() if k.startswith("UCX_")}
    print(f"device={args.device} bytes={nbytes} env={env}")
    seconds = []
    for i in range(args.repeat):
        bufs[1].zero_()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        local = src.get_xfer_descs([(bufs[0].data_ptr(), nbytes, idx)], mem)
        remote = src.get_xfer_descs([(bufs[1].data_ptr(), nbytes, idx)], mem)
        h = src.initialize_xfer("WRITE", local, remote, peer)
        t0 = time.perf_counter()
        state, deadline = src.transfer(h), time.monotonic() + args.timeout_s
        while state != "DONE":
            if state == "ERR" or time.monotonic() > deadline:
                raise SystemExit(f"write {i}: {state} after {time.perf_counter() - t0:.1f} s")
            dst.get_new_notifs()  # the target's UCX progresses too, as the harness's receiver thread does
            state = src.check_xfer_state(h)
        seconds.append(time.perf_counter() - t0)
        src.release_xfer_handle(h)
        ok = bool((bufs[1] == 7).all())
        print(f"write {i}: {seconds[-1] * 1e3:.1f} ms, {nbytes * 8 / seconds[-1] / 1e9:.2f} Gbit/s, intact={ok}")
    med = statistics.median(seconds)
    print(f"median {med * 1e3:.1f} ms, {nbytes * 8 / med / 1e9:.2f} Gbit/s over {args.repeat} writes")


if __name__ == "__main__":
    main()
