"""Percentiles, the spread of a median, and the one table formatter every report uses (a run's
per-request table, the sweep summary, the strategy benchmark).

A median of a handful of requests on a shared machine moves by tens of percent between runs, so
where a table compares strategies each p50 comes with a bootstrap interval: the p50 of the
requests resampled with replacement, many times, with a fixed seed so that a table is
reproducible from its records.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

RESAMPLES = 1000
LEVEL = 0.95
SEED = 0


def measured(values: Iterable) -> np.ndarray:
    """The values that were measured: None and NaN (not measured) dropped."""
    out = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return np.asarray(out, dtype=float)


def percentile(values: Iterable, q: float) -> float | None:
    """q-th percentile (0-100), linear interpolation between the closest ranks; None if nothing
    was measured."""
    vals = measured(values)
    return float(np.percentile(vals, q)) if len(vals) else None


def p50_interval(values: Iterable, level: float = LEVEL, resamples: int = RESAMPLES,
                 seed: int = SEED) -> tuple[float | None, float | None]:
    """Bootstrap percentile interval of the median: the (1-level)/2 and (1+level)/2 quantiles of
    the medians of `resamples` resamples. One value gives (value, value): no spread measured."""
    vals = measured(values)
    if not len(vals):
        return None, None
    rng = np.random.default_rng(seed)
    medians = np.median(vals[rng.integers(0, len(vals), size=(resamples, len(vals)))], axis=1)
    lo, hi = np.quantile(medians, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def p50_with_interval(values: Iterable, key: str) -> dict:
    """{key: p50, key_lo: ..., key_hi: ...}: the names the table formatter looks for."""
    vals = measured(values)
    lo, hi = p50_interval(vals)
    return {key: percentile(vals, 50), f"{key}_lo": lo, f"{key}_hi": hi}


# Student's t at 97.5% for 1-30 degrees of freedom (above: the normal's 1.96 is within 4%)
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def mean_interval(values: Iterable) -> tuple[float | None, float | None, float | None]:
    """The mean of a few independent measurements (runs) and its 95% t-interval; one value gives
    (value, None, None): no spread measured."""
    vals = measured(values)
    if not len(vals):
        return None, None, None
    mean = float(vals.mean())
    if len(vals) == 1:
        return mean, None, None
    t = _T975[len(vals) - 2] if len(vals) - 1 <= len(_T975) else 1.96
    half = t * float(vals.std(ddof=1)) / math.sqrt(len(vals))
    return mean, mean - half, mean + half


# ---------------------------------------------------------------------- tables
@dataclass
class Column:
    """One column: its header, the row key (default: the header; or a function of the row) and a
    format spec for floats. interval=True shows row[key] with row[key_lo] and row[key_hi] when
    they differ."""

    header: str
    key: str | Callable[[dict], Any] | None = None
    spec: str = ".3g"
    interval: bool = False

    def __post_init__(self):
        if self.key is None:
            self.key = self.header

    def cell(self, row: dict) -> str:
        if callable(self.key):
            return format_value(self.key(row), self.spec)
        text = format_value(row.get(self.key), self.spec)
        lo, hi = row.get(f"{self.key}_lo"), row.get(f"{self.key}_hi")
        if self.interval and _known(lo) and _known(hi) and format_value(lo, self.spec) != format_value(hi, self.spec):
            text += f" [{format_value(lo, self.spec)}, {format_value(hi, self.spec)}]"
        return text


def _known(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def format_value(v, spec: str = ".3g") -> str:
    if not _known(v):
        return "-"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "NO"
    if isinstance(v, (float, np.floating)):
        return format(float(v), spec)
    return str(v)


def format_table(rows: list[dict], columns: list[Column], markdown: bool = False, align: str = "right") -> str:
    """Plain text (columns padded, for a terminal) or a Markdown table (every column but the
    first right-aligned)."""
    header = [c.header for c in columns]
    body = [[c.cell(r) for c in columns] for r in rows]
    if markdown:
        rule = ["---"] + ["---:"] * (len(columns) - 1)  # the first column names the row
        return "\n".join("| " + " | ".join(cells) + " |" for cells in [header, rule, *body])
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(columns))]
    pad = str.rjust if align == "right" else str.ljust
    lines = ["  ".join(pad(c, w) for c, w in zip(line, widths, strict=True)) for line in [header, *body]]
    return "\n".join(line.rstrip() for line in lines)
