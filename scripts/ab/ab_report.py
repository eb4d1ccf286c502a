"""The A/B's tables, from the benchmark directories gpu_ab.sh wrote (one per run, named
NN-LABEL, each with an AB.json saying which tree and overrides it ran).

    python3 ab_report.py WORK_DIR [--out DIR]      (writes DIR/ab_report.md, ab_requests.csv, ab_transfers.csv)

Reads each run's requests.jsonl (the rows of either version of the harness: after_forward_ms is
derived from the timeline where a row lacks it, as the loader does) and both workers' transfer
records (digest_ms per side; the warm-up transfer, a negative prompt index, left out). Per label
(variant) and prompt length: medians with a 95% bootstrap interval over every request of every
round of that label, the means of the TTFT overhead's parts, and the median of each round alone
(the run-to-run spread, one engine start each) with their mean and its t-interval over the rounds
(what a rerun's start falls in); then each label against the first (the difference of medians,
with a bootstrap interval of it). A run of several strategies labels each one's runs
<label>:<strategy> (fused's: <label>).
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import statistics
from pathlib import Path

PARTS = ["prefill", "send", "delivery", "pickup", "scatter", "check", "decode"]
MEDIANS = ["ttft_overhead_ms", "after_forward_ms", "prefill_ttft_overhead_ms", "kv_ms", "transfer_ms",
           "ceiling_share", "base_ttft_ms", "ttft_ms", "digest_ms_send", "digest_ms_receive"]
SEED, RESAMPLES = 0, 1000


def median_ci(xs: list[float]) -> tuple[float, float, float]:
    xs = [x for x in xs if x is not None]
    if not xs:
        return (float("nan"),) * 3
    rng = random.Random(SEED)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(RESAMPLES))
    return statistics.median(xs), meds[int(0.025 * RESAMPLES)], meds[int(0.975 * RESAMPLES) - 1]


def diff_ci(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """median(b) - median(a), with a bootstrap interval (each side resampled on its own)."""
    a, b = [x for x in a if x is not None], [x for x in b if x is not None]
    if not a or not b:
        return (float("nan"),) * 3
    rng = random.Random(SEED)
    ds = sorted(statistics.median(rng.choices(b, k=len(b))) - statistics.median(rng.choices(a, k=len(a)))
                for _ in range(RESAMPLES))
    return statistics.median(b) - statistics.median(a), ds[int(0.025 * RESAMPLES)], ds[int(0.975 * RESAMPLES) - 1]


T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228]  # Student's t, 1-10 d.f.


def mean_t_interval(xs: list[float]) -> tuple[float, float, float]:
    """The mean of a few independent measurements (engine starts) and its 95% t-interval."""
    if len(xs) < 2:
        return (xs[0] if xs else float("nan")), float("nan"), float("nan")
    m = statistics.mean(xs)
    half = (T975[len(xs) - 2] if len(xs) <= len(T975) + 1 else 1.96) * statistics.stdev(xs) / len(xs) ** 0.5
    return m, m - half, m + half


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_dirs(bench: Path) -> list[Path]:
    """The harness run directories under one benchmark directory (one per strategy)."""
    return sorted(p.parent for p in bench.glob("*/requests.jsonl"))


def load(work: Path) -> tuple[list[dict], list[dict], list[dict]]:
    requests, transfers, runs = [], [], []
    for bench in sorted(p for p in work.iterdir() if p.is_dir() and (p / "AB.json").exists()):
        ab = json.loads((bench / "AB.json").read_text())
        for run in run_dirs(bench):
            summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
            ceiling = summary.get("copy_ceiling_gbps")
            label = ab["label"] if run.name == "fused" else f"{ab['label']}:{run.name}"  # other strategies apart
            meta = {"label": label, "round": ab["round"], "order": ab["index"], "tree": ab["tree"],
                    "commit": ab.get("commit", "?")[:10], "extra": ab.get("extra", ""), "run": run.name}
            runs.append(dict(meta, status=summary.get("status"), requests=summary.get("requests"),
                             ceiling=ceiling, timings=summary.get("timings"),
                             cudagraph=summary.get("cudagraph_modes") or summary.get("cudagraph_mode")))
            digest = {}
            for side, name in (("send", "prefill-transfers.jsonl"), ("receive", "decode-transfers.jsonl")):
                for r in read_jsonl(run / name):
                    tid = str(r.get("transfer_id", ""))
                    warm = "--" in tid  # the warm-up prompt's index is negative: "<tag>--1"
                    transfers.append(dict(meta, side=side, transfer_id=tid, warmup=warm, blocks=r.get("blocks"),
                                          digest_ms=r.get("digest_ms"), transfer_ms=r.get("transfer_ms"),
                                          gpu_ms=r.get("gpu_ms"), load_ms=r.get("load_ms")))
                    if not warm:
                        digest[(tid.rsplit("-", 1)[-1], side)] = r.get("digest_ms")
            for row in read_jsonl(run / "requests.jsonl"):
                if row.get("after_forward_ms") is None and row.get("t_forward_done_ms") is not None \
                        and row.get("t_first_token_ms") is not None:
                    row["after_forward_ms"] = row["t_first_token_ms"] - row["t_forward_done_ms"]
                gbps = row.get("gbps")
                row["ceiling_share"] = gbps / ceiling if gbps and ceiling else None
                idx = str(row.get("prompt_idx"))
                row["digest_ms_send"] = digest.get((idx, "send"))
                row["digest_ms_receive"] = digest.get((idx, "receive"))
                requests.append(dict(meta, **{k: row.get(k) for k in
                                             ["prompt_idx", "prompt_len", "match", "digest_match", "error", *MEDIANS,
                                              "gbps", *[f"overhead_{p}_ms" for p in PARTS]]}))
    return requests, transfers, runs


def fmt(v, spec=".2f") -> str:
    return "-" if v is None or v != v else format(v, spec)


def report(requests: list[dict], runs: list[dict]) -> str:
    labels = list(dict.fromkeys(r["label"] for r in sorted(runs, key=lambda r: r["order"])))
    lengths = sorted({r["prompt_len"] for r in requests})
    out = ["# A/B of source trees, runs alternated on one machine", ""]
    out.append("## Runs (in the order they ran)")
    out.append("")
    out.append("| # | label | round | tree | commit | extra overrides | status | requests | ceiling GB/s | startup s "
               "| total s |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted(runs, key=lambda r: r["order"]):
        t = r.get("timings") or {}
        out.append(f"| {r['order']} | {r['label']} | {r['round']} | {r['tree']} | {r['commit']} | "
                   f"{r['extra'] or '-'} | "
                   f"{r['status']} | {r['requests']} | {fmt(r['ceiling'], '.0f')} | {fmt(t.get('startup_s'), '.0f')} | "
                   f"{fmt(t.get('total_s'), '.0f')} |")
    for n in lengths:
        out += ["", f"## {n} tokens: median [95% interval] over every request of every round", ""]
        out.append("| metric | " + " | ".join(f"{lab} (n)" for lab in labels) + " |")
        out.append("|---|" + "---|" * len(labels))
        for m in MEDIANS:
            cells = []
            for lab in labels:
                xs = [r[m] for r in requests if r["label"] == lab and r["prompt_len"] == n and r.get(m) is not None]
                med, lo, hi = median_ci(xs)
                spec = ".2f" if m != "ceiling_share" else ".2f"
                cells.append(f"{fmt(med, spec)} [{fmt(lo, spec)}, {fmt(hi, spec)}] ({len(xs)})")
            out.append(f"| {m} | " + " | ".join(cells) + " |")
        for p in PARTS:
            cells = []
            for lab in labels:
                xs = [r[f"overhead_{p}_ms"] for r in requests
                      if r["label"] == lab and r["prompt_len"] == n and r.get(f"overhead_{p}_ms") is not None]
                cells.append(f"{fmt(statistics.mean(xs) if xs else None)} (mean)")
            out.append(f"| part: {p} | " + " | ".join(cells) + " |")
        if len(labels) > 1:
            out += ["", f"{n} tokens, each label against {labels[0]}: difference of medians [95% interval]", ""]
            out.append("| metric | " + " | ".join(f"{lab} - {labels[0]}" for lab in labels[1:]) + " |")
            out.append("|---|" + "---|" * (len(labels) - 1))
            parts = [f"overhead_{p}_ms" for p in ("scatter", "check", "decode")]
            for m in ["ttft_overhead_ms", "after_forward_ms", "prefill_ttft_overhead_ms", "kv_ms", "transfer_ms",
                      "digest_ms_send", "digest_ms_receive", *parts]:
                base = [r[m] for r in requests if r["label"] == labels[0] and r["prompt_len"] == n]
                cells = []
                for lab in labels[1:]:
                    d, lo, hi = diff_ci(base, [r[m] for r in requests if r["label"] == lab and r["prompt_len"] == n])
                    cells.append(f"{fmt(d)} [{fmt(lo)}, {fmt(hi)}]")
                out.append(f"| {m} | " + " | ".join(cells) + " |")
        out += ["", f"{n} tokens, per round (one engine start each): medians; parts check/decode as means", ""]
        out.append("| # | label | n | ttft_overhead | after_forward | prefill_ttft_overhead | kv_ms | transfer_ms | "
                   "ceiling share | digest send | digest recv | check | decode |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in sorted(runs, key=lambda r: r["order"]):
            rows = [q for q in requests if q["order"] == r["order"] and q["label"] == r["label"]
                    and q["prompt_len"] == n]
            if not rows:
                continue

            def med(m, rows=rows):
                xs = [q[m] for q in rows if q.get(m) is not None]
                return statistics.median(xs) if xs else None

            def mean(m, rows=rows):
                xs = [q[m] for q in rows if q.get(m) is not None]
                return statistics.mean(xs) if xs else None
            out.append(f"| {r['order']} | {r['label']} | {len(rows)} | {fmt(med('ttft_overhead_ms'))} | "
                       f"{fmt(med('after_forward_ms'))} | {fmt(med('prefill_ttft_overhead_ms'))} | "
                       f"{fmt(med('kv_ms'))} | {fmt(med('transfer_ms'), '.3f')} | {fmt(med('ceiling_share'))} | "
                       f"{fmt(med('digest_ms_send'), '.3f')} | "
                       f"{fmt(med('digest_ms_receive'), '.3f')} | {fmt(mean('overhead_check_ms'))} | "
                       f"{fmt(mean('overhead_decode_ms'))} |")
        out += ["", f"{n} tokens, between engine starts: the mean of each round's median [95% t-interval over the "
                f"rounds] (the interval a rerun's start falls in)", ""]
        out.append("| metric | " + " | ".join(f"{lab} (rounds)" for lab in labels) + " |")
        out.append("|---|" + "---|" * len(labels))
        for m in ["ttft_overhead_ms", "after_forward_ms", "prefill_ttft_overhead_ms", "kv_ms", "transfer_ms"]:
            cells = []
            for lab in labels:
                meds = [statistics.median(xs) for order in sorted({q["order"] for q in requests if q["label"] == lab})
                        if (xs := [q[m] for q in requests if q["order"] == order and q["label"] == lab
                                   and q["prompt_len"] == n and q.get(m) is not None])]
                mean, lo, hi = mean_t_interval(meds)
                cells.append(f"{fmt(mean, '.3f')} [{fmt(lo, '.3f')}, {fmt(hi, '.3f')}] ({len(meds)})")
            out.append(f"| {m} | " + " | ".join(cells) + " |")
    bad = [r for r in requests if r.get("error") or r.get("match") is False or r.get("digest_match") is False]
    out += ["", f"Requests with an error, a mismatch or a digest failure: {len(bad)} "
                "(dummy weights: outputs match trivially; the digests are the check)."]
    return "\n".join(out) + "\n"


def write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        path.write_text("")
        return
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("work")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    work = Path(args.work)
    out = Path(args.out or work)
    out.mkdir(parents=True, exist_ok=True)
    requests, transfers, runs = load(work)
    text = report(requests, runs) if requests else "no requests found under " + str(work) + "\n"
    (out / "ab_report.md").write_text(text)
    write_csv(out / "ab_requests.csv", requests)
    write_csv(out / "ab_transfers.csv", transfers)
    print(text)
    return 0 if requests else 1


if __name__ == "__main__":
    raise SystemExit(main())
