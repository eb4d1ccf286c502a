"""Compare a decode engine's greedy output with the colocated baseline's.

Three checks, as in vLLM's own model tests: exact token ids (where they first differ),
log-probabilities along the common prefix (how far apart the two engines' numbers are), and
vLLM's `check_logprobs_close` rule for a mismatch: at the first differing token, each engine's
token is among the other's top-k. Such a mismatch is a near tie that a few ulps of bf16 tip
either way (the decode engine computes the prompt's last token over loaded KV, the colocated
engine within one prefill: another kernel, another rounding), not KV gone wrong.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class Comparison:
    match: bool
    first_divergence: int | None  # index of the first differing token; None when equal
    max_logprob_diff: float | None  # largest |lp_a - lp_b| over the common prefix
    # a mismatch whose first differing tokens are each in the other's top-k (vLLM's
    # check_logprobs_close); None when they match or either side's top-k is unknown
    near_tie: bool | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def compare_outputs(base_ids: list[int], other_ids: list[int],
                    base_lp: list[float] | None = None, other_lp: list[float] | None = None,
                    base_top: list[list[int]] | None = None, other_top: list[list[int]] | None = None) -> Comparison:
    """base_top, other_top: each position's top-k token ids (the engine's logprobs, k >= 2)."""
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
    near_tie = None
    if (first is not None and first < n and base_top and other_top and first < min(len(base_top), len(other_top))
            and base_top[first] and other_top[first]):  # an empty top-k: unknown there
        near_tie = base_ids[first] in other_top[first] and other_ids[first] in base_top[first]
    return Comparison(first is None, first, diff, near_tie)
