"""How a run took what its scenario provoked (conf/scenario/, harness/scenario.py), from its rows,
for both runners' summaries and verdicts:

    provoked(row)        a row the scenario provoked on purpose: judged apart from the clean ones
    fault_counts(rows)   how the run took its faults (summary.json's faults_injected/caught/missed)
    aborted(rows)        how many requests it aborted (summary.json's aborted)
    lines(summary)       those counts as the run's printed lines
"""

from __future__ import annotations


# ---------------------------------------------------------------------- how the run took it
def given(value) -> bool:
    """A scenario's label in a row (fault, aborted): neither None nor empty nor a loaded NaN."""
    return bool(value) and value == value


def provoked(row: dict) -> bool:
    """A request whose transfer carried a fault or that was aborted on purpose: each is judged by
    what the scenario expects of it (a fault caught, nothing held), not by its output."""
    return given(row.get("fault")) or given(row.get("aborted"))


def fault_counts(rows: list[dict]) -> dict:
    """Transport faults injected (rows whose transfer carried one), those the decode engine caught
    (the request failed with a reason, or was recomputed to the right output) and those it
    missed. Empty without faults."""
    faulted = [r for r in rows if given(r.get("fault"))]
    if not faulted:
        return {}
    caught = sum(bool(r.get("error")) or (r.get("kv_recomputed") is True and bool(r.get("match"))) for r in faulted)
    return {"faults_injected": len(faulted), "faults_caught": caught, "faults_missed": len(faulted) - caught}


def aborted(rows: list[dict]) -> int:
    return sum(given(r.get("aborted")) for r in rows)


def lines(s: dict) -> list[str]:
    """What a scenario provoked and how the run took it (nothing when it provoked nothing)."""
    out = []
    if s.get("decode_preemptions") or s.get("prefill_preemptions") or s.get("kv_recomputed"):
        out.append(f"preemptions: decode {s.get('decode_preemptions', 0)}, prefill {s.get('prefill_preemptions', 0)}"
                   f"; prompts recomputed by the decode engine {s.get('kv_recomputed', 0)} "
                   f"({s.get('kv_recomputed_preempted', 0)} after a preemption)")
    if s.get("faults_injected"):
        out.append(f"transport faults injected {s['faults_injected']}: caught {s['faults_caught']}, "
                   f"missed {s['faults_missed']}")
    return out
