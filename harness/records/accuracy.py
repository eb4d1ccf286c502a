"""What a lossy strategy (transfer_strategies/codecs.py) costs in outputs, from a run's rows, for
both runners' summaries (a request row's codec fields come from the join, join.py codec_fields).

A lossless strategy must give the baseline's outputs (within the baseline's own noise: the
verdict's mismatch rule). A lossy one need not: its summary says how far it moved them, beside
the noise floor, and `check.max_accuracy_drop` (any strategy) fails a run whose exact-match rate
falls more than that below the baseline's own rerun's:

    codec                    the codec (None: the KV moved bit for bit)
    codec_max_rel            the largest reconstruction error over every request and layer,
                             relative to the layer's largest magnitude (codecs.reconstruction_error)
    codec_mean_rel           the mean over requests of the mean relative error (mean |error| /
                             mean |value|, the layers' mean)
    accuracy_drop            baseline_self_match_rate - match_rate (the baseline's rerun taken as 1
                             without one)
    first_divergence_mean    where outputs that differ first differ, on average (token index)
    logprob_drift_max/mean   the largest |logprob difference| along the common prefix, over requests
    task_score               workload=corpus: the mean share of output tokens equal to the text's own
    base_task_score          continuation (`task_score`), of the P/D outputs and of the baseline's
                             (the ceiling: what the model does with the KV it computed itself)
"""

from __future__ import annotations

from harness.records.stats import format_value


def task_score(output: list[int], reference: list[int] | None) -> float | None:
    """The share of output tokens equal to the reference's at the same position (over the shorter
    of the two); None without a reference."""
    n = min(len(output), len(reference or ()))
    return sum(a == b for a, b in zip(output, reference)) / n if n else None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _given(v) -> bool:
    return v is not None and v == v  # not None, nor a loaded NaN


def accuracy_cost(rows: list[dict], match_rate: float | None, self_match_rate: float | None) -> dict:
    codecs = sorted({r["codec"] for r in rows if _given(r.get("codec"))})
    out: dict = {"codec": "+".join(codecs) or None}
    rel = [r["codec_max_rel"] for r in rows if _given(r.get("codec_max_rel"))]
    out["codec_max_rel"] = max(rel) if rel else None
    out["codec_mean_rel"] = _mean([r["codec_mean_rel"] for r in rows if _given(r.get("codec_mean_rel"))])
    out["accuracy_drop"] = (None if match_rate is None
                            else (1.0 if self_match_rate is None else self_match_rate) - match_rate)
    out["first_divergence_mean"] = _mean([r["first_divergence"] for r in rows
                                          if _given(r.get("first_divergence")) and r.get("match") is False])
    drift = [r["max_logprob_diff"] for r in rows if _given(r.get("max_logprob_diff"))]
    out["logprob_drift_max"] = max(drift) if drift else None
    out["logprob_drift_mean"] = _mean(drift)
    for key in ("task_score", "base_task_score"):
        out[key] = _mean([r[key] for r in rows if _given(r.get(key))])
    return out


def line(s: dict) -> list[str]:
    """The summary's lines on a lossy run and on a task score (nothing for a lossless run without)."""
    f = format_value
    out = []
    if s.get("task_score") is not None:
        out.append(f"task score (output tokens equal to the text's continuation) {f(s['task_score'], '.3f')}, "
                   f"baseline {f(s.get('base_task_score'), '.3f')}")
    if s.get("kv_cache_dtype"):
        out.append(f"the prefill and decode engines store KV as {s['kv_cache_dtype']}, the baseline at full precision: "
                   f"outputs compared, not required to match; exact-match drop against the baseline's own "
                   f"{f(s.get('accuracy_drop'), '+.3f')}, logprob drift max {f(s.get('logprob_drift_max'), '.2e')}")
    if not s.get("codec"):
        return out
    return out + [f"lossy ({s['codec']}): reconstruction error max {f(s.get('codec_max_rel'), '.2e')} of the layer's "
            f"largest value, mean {f(s.get('codec_mean_rel'), '.2e')}; exact-match drop against the baseline's own "
            f"{f(s.get('accuracy_drop'), '+.3f')}; first divergence at token "
            f"{f(s.get('first_divergence_mean'), '.1f')} on average; logprob drift max "
            f"{f(s.get('logprob_drift_max'), '.2e')}"]
