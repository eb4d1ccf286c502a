"""A finished run's status from what it counted: the same rules, in the same order, for both
runners (harness/offline/run.py, harness/records/serve_summary.py for runner=serve), so that a status
means one thing whichever runner wrote it. The first rule that holds decides:

    transfer_failed  a request's KV was not loaded (a transfer error)
    mismatch         a block's digests differ, or more outputs differ from the baseline's than
                     the baseline's own second pass differs from its first (greedy decoding's
                     noise), near ties not counted (harness/records/compare.py); a lossy strategy's
                     outputs may differ (its digests judge the transport: codecs.py)
    accuracy_drop    the exact-match rate fell more than check.max_accuracy_drop below the
                     baseline's own rerun's (harness/records/accuracy.py; any strategy, when set)
    kv_recomputed    a decode engine computed a prompt it was sent, not preempted (unless the
                     scenario expects it)
    kv_miscounted    a decode engine started a request from more prompt tokens (its prefix-cache
                     hits and the tokens it received) than the prefill sent the KV of: it trusted
                     KV nobody sent (outputs and digests may still match)
    kv_not_moved     runner=serve: a request the router disaggregated left no sign of a transfer (no
                     send record, no decode compute record): it went to the decode instance alone
                     unannounced (serve.pd_policy=selective announces its decode-only requests)
    fault_missed     an injected transport fault went unseen (scenarios)
    kv_leak          KV blocks or transfers still held after every request ended
    requests_failed  a request failed other than by its time limit (runner=serve)
    scenario_unmet   the run did not show what its scenario says it must (conf/scenario/*.yaml
                     `expect`: decode requests preempted, faults injected and caught, ...)

A run that ends before its passes do is engine_failed (exit 3) or interrupted (130): ended_early.
"""

from __future__ import annotations

import operator
import re
import sys
from pathlib import Path

from harness.records.summary import unexplained_recomputes


def judge(counts: dict, *, noise: int, expect_recompute: bool = False, first_transfer_error: str | None = None,
          faults: tuple[int, int] = (0, 0), held: dict | None = None,
          failed_requests: list[str] | None = None, lossy: bool = False, accuracy_drop: float | None = None,
          max_accuracy_drop: float | None = None, scenario_unmet: list[str] | None = None
          ) -> tuple[str, str | None]:
    """(status, the one-line reason or None when ok). counts: the summary's transfer_errors,
    digest_failures, digest_checked, mismatches, near_ties, kv_recomputed(_preempted); noise: the
    baseline's mismatches with itself; faults: (missed, injected); held: what is still held, by
    engine (only what is non-empty); failed_requests: a line per request that failed; lossy: the
    strategy moves a compressed image of the KV (outputs are measured, not required to match);
    accuracy_drop, max_accuracy_drop: the summary's and check.max_accuracy_drop (None: no gate);
    scenario_unmet: what the scenario expects that the run did not show (unmet)."""
    if counts.get("transfer_errors"):
        return "transfer_failed", (f"{counts['transfer_errors']} transfer(s) failed"
                                   + (f": {first_transfer_error}" if first_transfer_error else ""))
    differ = (counts.get("mismatches") or 0) - (counts.get("near_ties") or 0)
    if counts.get("digest_failures"):
        return "mismatch", (f"{counts['digest_failures']} of {counts.get('digest_checked')} transfers arrived with "
                            f"KV blocks whose digests differ from the sender's; {differ} output(s) differ")
    if differ > noise and not lossy:
        near = counts.get("near_ties") or 0
        return "mismatch", (f"{differ} output(s) differ from the baseline's" + (f" (besides {near} at a near tie)"
                            if near else "") + f"; the baseline differs from itself in {noise}"
                            + ("; every KV block arrived intact (digests match): the decode engine used the KV "
                               "wrongly or before it had arrived" if counts.get("digest_checked") else ""))
    if max_accuracy_drop is not None and accuracy_drop is not None and accuracy_drop > max_accuracy_drop:
        return "accuracy_drop", (f"the exact-match rate is {accuracy_drop:.3f} below the baseline's own rerun's "
                                 f"(check.max_accuracy_drop={max_accuracy_drop})")
    if unexplained_recomputes(counts) and not expect_recompute:
        return "kv_recomputed", (f"{unexplained_recomputes(counts)} request(s) recomputed their prompt on the decode "
                                 f"engine instead of using the KV they were sent (not preempted; see kv_recomputed "
                                 f"in requests.jsonl)")
    if counts.get("kv_miscounted"):
        return "kv_miscounted", (f"{counts['kv_miscounted']} request(s) started decoding from prompt tokens nobody "
                                 f"sent the KV of (decode_cached_tokens above sent_tokens in the rows)")
    if counts.get("kv_not_moved"):
        return "kv_not_moved", (f"{counts['kv_not_moved']} request(s) the router disaggregated left no transfer record "
                                f"on either side: no KV moved for them (see route and sent_tokens in requests.jsonl)")
    missed, injected = faults
    if missed:
        return "fault_missed", (f"{missed} of {injected} injected transport faults went unseen: neither failed nor "
                                f"recomputed by the decode engine (see fault in requests.jsonl)")
    if held:
        return "kv_leak", f"KV or transfers still held after every request finished: {held}"
    if failed_requests:
        return "requests_failed", f"{len(failed_requests)} request(s) failed, e.g. {failed_requests[0]}"
    if scenario_unmet:
        return "scenario_unmet", f"the scenario expects {'; '.join(scenario_unmet)}"
    return "ok", None


def ended_early(e: BaseException, run_dir: Path) -> tuple[str, int, str]:
    """(status, exit code, error) of a run that an engine's or instance's death (exit 3) or the
    user (Ctrl-C, exit 130) ended; says so, and where the records written so far are."""
    if isinstance(e, KeyboardInterrupt):
        print(f"\ninterrupted; records written so far are in {run_dir}", file=sys.stderr)
        return "interrupted", 130, "interrupted"
    print(f"\nerror: {e}\nRecords written so far are in {run_dir}", file=sys.stderr)
    return "engine_failed", 3, str(e)


CONDITION = re.compile(r"^\s*(>=|<=|==|!=|>|<)\s*([\w.+-]+)\s*$")
COMPARE = {">=": operator.ge, "<=": operator.le, "==": operator.eq, "!=": operator.ne, ">": operator.gt,
           "<": operator.lt}


def condition(text: str) -> tuple[str, str]:
    """(operator, operand) of a scenario's condition on a summary key (`>= 1`, `== faults_injected`);
    ValueError when it is not one."""
    m = CONDITION.match(str(text))
    if not m:
        raise ValueError(f"{text!r} is not a condition: an operator (>=, <=, ==, !=, >, <) and a number or a "
                         f"summary.json key")
    return m.group(1), m.group(2)


def unmet(summary: dict, expect: dict | None) -> list[str]:
    """What a scenario says its run must show (conf/scenario/*.yaml `expect`: summary.json key ->
    condition) that the summary does not: one line each, with what the run showed."""
    out = []
    for key, text in (expect or {}).items():
        op, operand = condition(text)
        try:
            want = float(operand)
        except ValueError:
            want = summary.get(operand)
        got = summary.get(key)
        if got is None or want is None or not COMPARE[op](got, want):
            out.append(f"{key} {op} {operand} (the run showed {key} {got}"
                       + (f", {operand} {want}" if operand in summary else "") + ")")
    return out
