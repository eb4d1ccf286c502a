"""The run-level figures of summary.json that tables show, declared once as fields.py declares the
per-request ones (whose statistics, `<field>_p50` and the rest, the tables take from their Field):
the key, its column header, format, which direction is better, the views showing it (sweep,
serve, accuracy: fields.py lists them) and the runners whose summary has it. results/README.md
says what each key means."""

from __future__ import annotations

from dataclasses import dataclass

from harness.records.fields import OFFLINE, SERVE, VIEWS


@dataclass(frozen=True)
class Figure:
    key: str
    label: str
    spec: str = ".3g"
    better: str | None = None  # "lower" or "higher"
    shown: tuple[str, ...] = ()
    runners: tuple[str, ...] = (OFFLINE,)
    pooled: str = "mean"  # how a report pools it over runs of one cell: mean, sum (a count), first (a name)

    def __post_init__(self):
        assert not set(self.shown) - set(VIEWS), f"{self.key}: no view {set(self.shown) - set(VIEWS)}"


BOTH = (OFFLINE, SERVE)
RATE = {"spec": ".2f", "runners": (SERVE,)}

FIGURES: list[Figure] = [
    Figure("request_rate", "requested", **RATE, shown=("sweep",)),
    Figure("ok", "ok", ".0f", "higher", ("serve",), (SERVE,)),
    Figure("failed", "failed", ".0f", "lower", ("serve",), (SERVE,)),
    Figure("timed_out", "timed out", ".0f", "lower", ("serve",), (SERVE,)),
    Figure("cancelled", "cancelled", ".0f", None, ("serve",), (SERVE,)),
    Figure("scheduled_rate", "scheduled", **RATE, shown=("serve",)),
    Figure("achieved_rate", "achieved", **RATE, shown=("serve", "sweep")),
    Figure("request_throughput", "req/s", ".2f", "higher", ("serve",), (SERVE,)),
    Figure("output_throughput", "tok/s", ".1f", "higher", ("serve",), (SERVE,)),
    Figure("goodput", "goodput", ".2f", "higher", ("serve", "sweep"), (SERVE,)),
    Figure("base_goodput", "base goodput", ".2f", "higher", ("sweep",), (SERVE,)),
    # ITL with a prefill in flight over ITL without, minus one (harness/records/interference.py)
    Figure("interference", "interference", "+.2f", "lower", ("serve", "sweep"), (SERVE,)),
    Figure("base_interference", "base interference", "+.2f", "lower", ("sweep",), (SERVE,)),
    Figure("slo_attainment", "SLO met", ".2f", "higher", ("serve", "sweep"), (SERVE,)),
    Figure("requests", "requests", ".0f", None, ("sweep", "accuracy"), pooled="sum"),
    Figure("match_rate", "match", ".3g", "higher", ("sweep", "accuracy"), BOTH),
    Figure("baseline_self_match_rate", "baseline self-match", ".3g", "higher", ("sweep", "accuracy"), BOTH),
    Figure("near_ties", "near ties", ".0f", None, ("accuracy",), BOTH, pooled="sum"),
    Figure("digest_failures", "digest failures", ".0f", "lower", ("sweep",), BOTH),
    Figure("transfer_gbps", "GB/s", ".3g", "higher", ("sweep",)),
    Figure("handover_overhead_mean_ms", "handover overhead ms", "+.1f", "lower", ("sweep",), (SERVE,)),
    Figure("codec", "codec", shown=("sweep", "accuracy"), runners=BOTH, pooled="first"),
    Figure("codec_max_rel", "error max", ".2e", "lower", ("accuracy",), BOTH),
    Figure("codec_mean_rel", "error mean", ".2e", "lower", ("accuracy",), BOTH),
    Figure("accuracy_drop", "exact-match drop", ".3g", "lower", ("sweep", "accuracy"), BOTH),
    Figure("first_divergence_mean", "first divergence", ".3g", "higher", ("accuracy",), BOTH),
    Figure("logprob_drift_max", "logprob drift max", ".2e", "lower", ("accuracy",), BOTH),
    Figure("logprob_drift_mean", "logprob drift mean", ".2e", "lower", ("accuracy",), BOTH),
    Figure("task_score", "task score", ".3g", "higher", ("sweep", "accuracy"), BOTH),
    Figure("base_task_score", "baseline task score", ".3g", "higher", ("accuracy",), BOTH),
]


def figures_in(view: str, runner: str = OFFLINE) -> list[Figure]:
    return [f for f in FIGURES if view in f.shown and runner in f.runners]
