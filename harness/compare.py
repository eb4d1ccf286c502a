"""Compare a decode engine's greedy output with the colocated baseline's.

Two kinds of check, as in vLLM's own model tests: exact token ids (where they first differ)
and log-probabilities along the common prefix (how far apart the two engines' numbers are,
which says whether a mismatch is numeric noise near a tie or a broken transfer).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class Comparison:
    match: bool
    first_divergence: int | None  # index of the first differing token; None when equal
    max_logprob_diff: float | None  # largest |lp_a - lp_b| over the common prefix

    def as_dict(self) -> dict:
        return asdict(self)


def compare_outputs(base_ids: list[int], other_ids: list[int],
                    base_lp: list[float] | None = None, other_lp: list[float] | None = None) -> Comparison:
    n = min(len(base_ids), len(other_ids))
    first = next((i for i in range(n) if base_ids[i] != other_ids[i]), None)
    if first is None and len(base_ids) != len(other_ids):
        first = n
    common = n if first is None else first
    diff = None
    if base_lp is not None and other_lp is not None:
        # the first differing token's logprobs still describe the same position: include it
        upto = min(common + 1, n)
        diffs = [abs(a - b) for a, b in zip(base_lp[:upto], other_lp[:upto])]
        diff = max(diffs) if diffs else 0.0
    return Comparison(first is None, first, diff)
