"""harness/records/stats.py: percentiles, the p50's bootstrap interval, the one table formatter."""

import numpy as np
import pytest

from harness.records.stats import Column, format_table, mean_interval, p50_interval, p50_with_interval, percentile


def test_percentile_interpolates_and_skips_what_was_not_measured():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([5], 90) == 5
    assert percentile([1, None, float("nan"), 3], 50) == 2
    assert percentile([None, float("nan")], 50) is None


def test_p50_interval_holds_the_median_is_seeded_and_narrows_with_more_requests():
    rng = np.random.default_rng(1)
    few, many = rng.normal(10, 2, 8), rng.normal(10, 2, 400)
    lo, hi = p50_interval(few)
    assert lo <= np.median(few) <= hi and lo < hi
    assert p50_interval(few) == (lo, hi)  # the same table from the same records
    lo_many, hi_many = p50_interval(many)
    assert hi_many - lo_many < (hi - lo) / 2
    assert 9 < lo_many < 10 < hi_many < 11


def test_p50_interval_of_one_or_no_value():
    assert p50_interval([3.0]) == (3.0, 3.0)
    assert p50_interval([None]) == (None, None)
    assert p50_with_interval([1.0, 2.0, 3.0], "x") == {"x": 2.0, "x_lo": p50_interval([1, 2, 3])[0],
                                                      "x_hi": p50_interval([1, 2, 3])[1]}


def test_mean_interval_of_a_few_runs_is_students_t():
    mean, lo, hi = mean_interval([10.0, 12.0, 14.0])  # sd 2, t(2 dof) 4.303: 10 +- 4.97
    assert mean == 12.0 and lo == pytest.approx(12 - 4.303 * 2 / 3 ** 0.5) and hi == pytest.approx(12 + 4.969, abs=1e-3)
    assert mean_interval([5.0, None]) == (5.0, None, None) and mean_interval([]) == (None, None, None)
    assert mean_interval([1.0] * 40)[1:] == (1.0, 1.0)  # past 30 degrees of freedom: the normal's 1.96


def test_table_shows_an_interval_only_where_the_values_differ():
    rows = [{"name": "a", "ms": 1.0, "ms_lo": 0.5, "ms_hi": 2.0, "ok": True},
            {"name": "bb", "ms": 3.0, "ms_lo": 3.0, "ms_hi": 3.0, "ok": False},
            {"name": "c", "ms": None, "ok": None}]
    cols = [Column("name"), Column("ms", spec=".2f", interval=True), Column("ok"),
            Column("twice", lambda r: 2 * r["ms"] if r["ms"] else None, ".1f")]
    text = format_table(rows, cols).splitlines()
    assert text[0].split() == ["name", "ms", "ok", "twice"]
    assert text[1].split() == ["a", "1.00", "[0.50,", "2.00]", "yes", "2.0"]
    assert text[2].split() == ["bb", "3.00", "NO", "6.0"]
    assert text[3].split() == ["c", "-", "-", "-"]
    assert len({len(line) for line in text}) == 1  # right-aligned columns
    md = format_table(rows, cols, markdown=True).splitlines()
    assert md[0] == "| name | ms | ok | twice |" and md[1] == "| --- | ---: | ---: | ---: |"
    assert md[2] == "| a | 1.00 [0.50, 2.00] | yes | 2.0 |"
