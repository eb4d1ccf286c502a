"""The interference factor of a serving path (harness/records/interference.py): token gaps with
another request in its prefill phase against gaps with none, from the rows' own times."""

from harness.records.interference import interference


def row(sent_s: float, ttft_ms: float, itl_ms: list[float], **kw) -> dict:
    return {"status": "ok", "sent_s": sent_s, "ttft_ms": ttft_ms, "itl_ms": itl_ms, "coalesced": False, **kw}


def test_gaps_a_prefill_overlaps_against_gaps_none_does():
    # A's first token at 1.00 s, then gaps of 10 ms but 30 ms twice, from 1.02 to 1.08 s; B is in its
    # prefill from 1.02 to 1.06 s: it overlaps exactly A's two long gaps (a window's touching end does not)
    a = row(0.9, 100.0, [10, 10, 30, 30, 10, 10])
    b = row(1.02, 40.0, [10, 10])
    assert interference([a, b]) == {"interference": 2.0, "interference_lo": 2.0, "interference_hi": 2.0}
    # the same gaps with nobody in prefill meanwhile: nothing to compare
    assert interference([a])["interference"] is None
    # a coalesced stream's gaps are the API server's flushes: left out, and so is a failed request
    assert interference([a, b | {"coalesced": True}])["interference"] == 2.0
    assert interference([a | {"status": "failed"}, b])["interference"] is None


def test_its_interval_comes_from_resampling_the_requests():
    quiet = [row(10.0 + i, 50.0, [10, 10, 10]) for i in range(6)]  # one at a time: 10 ms gaps, nobody in prefill
    # two requests decode while one-token requests (no gaps of their own) prefill back to back: 30 and 20 ms gaps
    busy = [row(0.0, 50.0, [30] * 10), row(0.0, 50.0, [20] * 10)]
    prefills = [row(0.05 + 0.03 * i, 30.0, []) for i in range(11)]
    out = interference(quiet + busy + prefills)
    assert out["interference"] == 25 / 10 - 1  # (300 + 200 ms) / 20 gaps against 10 ms
    assert 1.0 <= out["interference_lo"] < out["interference"] < out["interference_hi"] <= 2.0
