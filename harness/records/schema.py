"""The rows a run writes, as fields.py declares them:

    baseline.jsonl   BaselineRow, one per prompt of the colocated engine
    requests.jsonl   RequestRow, one per prompt of the disaggregated run
    *-transfers.jsonl  TransferRecord (transfer_strategies/records.py), one per transfer per side
  runner=serve (harness/serving/serve.py): baseline.jsonl and requests.jsonl hold ServeRow, one per
  request of the load as the client saw it (requests.jsonl: the P/D path)

A row type builds a row (a dict, in the declared column order) from every field it declares, and
says which fields it has; the writers, the pandas loader (harness/report/load.py) and
results/README.md's tables (markdown_table) use them. Every row carries schema_version
(SCHEMA_VERSION when written); rows of version 1 have none; results/README.md says what each
version means. The views (shown_in, summarized) are what the tables and summaries iterate.
"""

from __future__ import annotations

import dataclasses

from harness.records.critical_path import CRITICAL_PATH, HANDOVER_PATH
from harness.records.fields import (
    BASELINE,
    FIELDS,
    OFFLINE,
    REQUIRED,
    SERVE,
    Field,
)

# The version of the harness's rows and summaries (schema_version in each); the connectors' records
# have their own (transfer_strategies/records.py RECORD_VERSION), the same number up to 16.
#  17: versioned apart; the fields declared once (fields.py); the status scenario_unmet
#  18: summary.json's kv_geometry (both runners)
#  19: each row's token sources (sent_tokens, decode_hit_tokens, decode_loaded_tokens, both runners), their sums,
#      kv_miscounted and its status
#  20: serving rows' route (serve.pd_policy=selective: disagg or decode_only), the summary's decode_only_requests,
#      kv_not_moved and its status
SCHEMA_VERSION = 20
UNVERSIONED = 1  # what a row without schema_version is
# a serving row's route (the P/D router's X-PD-Route): prefill then decode, or the decode instance alone
DISAGG, DECODE_ONLY = "disagg", "decode_only"

OVERHEAD_PARTS = [f"overhead_{part}_ms" for part, _ in CRITICAL_PATH]
HANDOVER_PARTS = [f"handover_{part}_ms" for part, _ in HANDOVER_PATH]


class RowType:
    """One kind of row: the declared fields whose `rows` name it, in declaration order (read when
    asked, so a field declared later, as a test does, is in)."""

    def __init__(self, kind: str, file: str):
        self.kind, self.file = kind, file

    @property
    def fields(self) -> list[Field]:
        return [f for f in FIELDS if self.kind in f.rows]

    def names(self) -> list[str]:
        return [f.name for f in self.fields]

    def __call__(self, **values) -> dict:
        """The row, every field in order: each required one given, the others defaulted, none unknown."""
        values.setdefault("schema_version", SCHEMA_VERSION)
        fields = self.fields
        unknown = set(values) - {f.name for f in fields}
        missing = [f.name for f in fields if f.default is REQUIRED and f.name not in values]
        if unknown or missing:
            raise TypeError(f"{self.kind} row: unknown fields {sorted(unknown)}, missing {missing}")
        return {f.name: values.get(f.name, None if f.default is REQUIRED else f.default) for f in fields}

    def known(self, values: dict) -> dict:
        """Those of values that are this row's fields (a join's fields, which both runners share)."""
        names = set(self.names())
        return {k: v for k, v in values.items() if k in names}


RequestRow = RowType(OFFLINE, "requests.jsonl")
ServeRow = RowType(SERVE, "requests.jsonl")
BaselineRow = RowType(BASELINE, "baseline.jsonl")


def field_names(row: RowType | type) -> list[str]:
    """A row type's columns, or a record dataclass's fields (transfer_strategies/records.py)."""
    return row.names() if isinstance(row, RowType) else [f.name for f in dataclasses.fields(row)]


def field(name: str) -> Field:
    return next(f for f in FIELDS if f.name == name)


def shown_in(view: str, row: str = OFFLINE) -> list[Field]:
    """The fields a table shows (fields.py lists the views), in declaration order."""
    return [f for f in FIELDS if view in f.shown and row in f.rows]


def summarized(runner: str) -> list[Field]:
    """The fields summary.json sums up for a runner (their Stats)."""
    return [f for f in FIELDS if runner in f.summary]


def markdown_table(kind: str) -> str:
    """results/README.md's table of one kind of row (scripts/doc_tables.py writes it there): a line
    per field, or per run of adjacent fields alike (`strategy, model, workload, device`), with its
    unit and what summary.json gives of it (p50 with its 95% interval, p90, p99)."""
    runner = SERVE if kind == SERVE else OFFLINE

    def cells(f: Field, runner=runner) -> tuple[str, str, str]:
        stats = f.summary.get(runner) if kind != BASELINE else None
        given = ", ".join("p50 [95%]" if s == "p50" else s for s in stats.stats) if stats else ""
        if stats and runner == SERVE:
            given += " per path" + (", when measured" if stats.only_measured else "")
        return f.unit, given, f.meaning(kind)

    lines = ["| column | unit | summary.json | meaning |", "| --- | --- | --- | --- |"]
    group: list[str] = []
    fields = [f for f in FIELDS if kind in f.rows]
    for i, f in enumerate(fields):
        group.append(f.name)
        following = fields[i + 1] if i + 1 < len(fields) else None
        if following is None or cells(following) != cells(f):
            lines.append("| " + " | ".join([", ".join(group), *cells(f)]) + " |")
            group = []
    return "\n".join(lines)
