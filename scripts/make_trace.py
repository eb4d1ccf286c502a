"""A seeded request trace in Mooncake's format (workload=trace) with mixed prompt lengths and prefix
sharing: what a selective router is judged on (docs/serving.md, "When disaggregation pays").

    python scripts/make_trace.py --out /tmp/mixed.jsonl --requests 48 --rate 2 --block-tokens 32

Each request's length is drawn log-uniform between --min-len and --max-len tokens. A share of them
(--system-share) start with one of a few shared system prompts, and a share (--follow-share)
continue an earlier request: its blocks, then new ones, as a conversation's next turn does, so the
decode instance that served the earlier one holds most of it. Arrivals are Poisson at --rate.
Hash ids stand for blocks of --block-tokens tokens: give the trace workload the same
(workload.block_tokens), ideally the engines' block size, so that shared blocks are whole KV blocks.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path


def make_trace(requests: int, rate: float, min_len: int, max_len: int, block_tokens: int, seed: int = 0,
               system_share: float = 0.4, follow_share: float = 0.3, outputs: tuple[int, int] = (8, 32)) -> list[dict]:
    rng = random.Random(seed)
    next_id = iter(range(10**9))
    systems = [[next(next_id) for _ in range(max(1, n // block_tokens))] for n in (64, 128, 256)]
    out, t = [], 0.0
    for _ in range(requests):
        t += rng.expovariate(rate) * 1e3
        n = round(math.exp(rng.uniform(math.log(min_len), math.log(max_len))))
        if out and rng.random() < follow_share:
            before = rng.choice(out)
            ids = before["hash_ids"] + [next(next_id) for _ in range(max(1, n // block_tokens // 4))]
        else:
            start = rng.choice(systems) if rng.random() < system_share else []
            ids = start + [next(next_id) for _ in range(max(0, math.ceil(n / block_tokens) - len(start)))]
        length = min(max(n, len(ids) * block_tokens - rng.randrange(block_tokens)), max_len)
        ids = ids[:math.ceil(length / block_tokens)]
        out.append({"timestamp": round(t, 1), "input_length": length, "output_length": rng.randint(*outputs),
                    "hash_ids": ids})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--rate", type=float, default=2.0, help="requests per second (Poisson)")
    ap.add_argument("--min-len", type=int, default=16)
    ap.add_argument("--max-len", type=int, default=1536)
    ap.add_argument("--block-tokens", type=int, default=32)
    ap.add_argument("--system-share", type=float, default=0.4)
    ap.add_argument("--follow-share", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if not (a.requests >= 1 and a.rate > 0 and 1 <= a.min_len <= a.max_len and a.block_tokens >= 1
            and 0 <= a.system_share <= 1 and 0 <= a.follow_share <= 1):
        ap.error("need --requests >= 1, --rate > 0, 1 <= --min-len <= --max-len, --block-tokens >= 1 and shares "
                 "in [0, 1]")
    trace = make_trace(a.requests, a.rate, a.min_len, a.max_len, a.block_tokens, a.seed, a.system_share,
                       a.follow_share)
    a.out.write_text("".join(json.dumps(r) + "\n" for r in trace))
    lengths = sorted(r["input_length"] for r in trace)
    print(f"{a.out}: {len(trace)} requests over {trace[-1]['timestamp'] / 1e3:.1f} s, prompts {lengths[0]} to "
          f"{lengths[-1]} tokens (median {lengths[len(lengths) // 2]})")


if __name__ == "__main__":
    main()
