"""How much prefills stall decodes on one serving path: the interference factor (NVIDIA AIPerf's
research notes define it so), from the rows' own token times.

Every gap between two output tokens of a request that ended ok (its `itl_ms`, placed on the
client's clock from `sent_s` and `ttft_ms`) is either overlapped by another request of the same
path in its prefill phase (sent, its first token not back yet) or not. The factor is the mean gap
with a prefill in flight over the mean gap with none, minus one: colocated serving, where one
engine's steps carry both, shows it high; disaggregated serving, whose decode engine computes
only each prompt's last token, about zero. Its 95% interval is the bootstrap's over requests
(resampled with replacement, seed 0, as a p50's: stats.py). A stream the API server coalesced
(`coalesced`: its gaps are flushes, not steps) is left out; null without gaps of both kinds.
"""

from __future__ import annotations

import numpy as np

from harness.records.stats import LEVEL, RESAMPLES, SEED


def _per_request(rows: list[dict]) -> np.ndarray:
    """Per request that ended ok: [sum, count] of its gaps (ms) another request's prefill
    overlapped, then [sum, count] of those none did."""
    windows = [(r["sent_s"], r["sent_s"] + r["ttft_ms"] / 1e3, i) for i, r in enumerate(rows)
               if r.get("ttft_ms") is not None]
    out = []
    for i, r in enumerate(rows):
        if r.get("status") != "ok" or r.get("coalesced") or not r.get("itl_ms") or r.get("ttft_ms") is None:
            continue
        t, sums = r["sent_s"] + r["ttft_ms"] / 1e3, [0.0, 0, 0.0, 0]
        for gap in r["itl_ms"]:
            start, t = t, t + gap / 1e3
            busy = any(j != i and s < t and e > start for s, e, j in windows)
            sums[0 if busy else 2] += gap
            sums[1 if busy else 3] += 1
        out.append(sums)
    return np.asarray(out, dtype=float).reshape(-1, 4)


def _factors(sums: np.ndarray) -> np.ndarray:
    """The factor of each set of requests ([..., requests, 4]); NaN without gaps of both kinds."""
    t = sums.sum(axis=-2)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (t[..., 0] / t[..., 1]) / (t[..., 2] / t[..., 3]) - 1


def interference(rows: list[dict], key: str = "interference") -> dict:
    """{key: the factor, key_lo, key_hi: its 95% bootstrap interval over requests} of one path's rows."""
    sums = _per_request(rows)
    factor = float(_factors(sums)) if len(sums) else float("nan")
    if not np.isfinite(factor):
        return {key: None, f"{key}_lo": None, f"{key}_hi": None}
    picks = np.random.default_rng(SEED).integers(0, len(sums), size=(RESAMPLES, len(sums)))
    resampled = _factors(sums[picks])
    lo, hi = np.quantile(resampled[np.isfinite(resampled)], [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return {key: factor, f"{key}_lo": float(lo), f"{key}_hi": float(hi)}
