"""The offline runner's rows, written as each prompt finishes so that a run stopped halfway keeps
what it measured: the baseline's (baseline.jsonl, baseline_repeat.jsonl: schema.BaselineRow) and the
P/D path's (requests.jsonl: schema.RequestRow, with both sides' transfer records, harness/records/join.py)."""

from __future__ import annotations

from pathlib import Path

from harness.records.accuracy import task_score
from harness.records.compare import compare_outputs
from harness.records.files import JsonlWriter
from harness.records.join import kv_gated, timeline, transfer_fields, ttft_overhead_parts
from harness.records.schema import BaselineRow, RequestRow
from harness.records.transfer_records import TransferStats
from harness.settings import Settings
from harness.workload import Prompt


def baseline_row(run_id: str, p: Prompt, t0: float, results: list[dict]) -> dict:
    """baseline.jsonl's (and baseline_repeat.jsonl's) row for one prompt."""
    (r,) = results
    return BaselineRow(run_id=run_id, prompt_idx=p.index, prompt_len=len(p.token_ids),
                       ttft_ms=(r["first_token_t"] - t0) * 1e3, e2e_ms=(r["finished_t"] - t0) * 1e3,
                       token_ids=r["token_ids"], logprobs=r["logprobs"], top_ids=r.get("top_ids"),
                       task_score=task_score(r["token_ids"], p.reference))


def disagg_row(settings: Settings, run_id: str, p: Prompt, t0: float, results: list[dict], base: dict,
               stats: TransferStats, transfer_id: str) -> dict:
    """requests.jsonl's row for one prompt: the two engines' results, the baseline's row, the join of
    both sides' transfer records (harness/records/join.py) and the request's timeline."""
    cfg, pre, dec = settings.cfg, *results
    send, recv, digest_match = stats.take_transfer(transfer_id, received=dec.get("finish_reason") not in (
        "abort", "error", "not_sent"))
    joined = transfer_fields(send, recv, digest_match, stats.take(transfer_id, "prefill"),
                             stats.take(transfer_id, "decode"))
    cmp = compare_outputs(base["token_ids"], dec["token_ids"], base["logprobs"], dec["logprobs"],
                          base.get("top_ids"), dec.get("top_ids"))
    ttft = (dec["first_token_t"] - t0) * 1e3
    prefill_ttft = (pre["first_token_t"] - t0) * 1e3
    t = timeline(t0, pre, dec, send, recv)
    after_forward_ms = None
    if t["t_forward_done_ms"] is not None:
        after_forward_ms = t["t_first_token_ms"] - t["t_forward_done_ms"]
    error = recv.error if recv is not None else None
    if dec.get("finish_reason") == "error":
        error = error or "the decode engine failed the request"
    return RequestRow(
        **RequestRow.known(joined),
        run_id=run_id, strategy=cfg.strategy.name, model=cfg.model.name, workload=cfg.workload.name,
        device=settings.device,
        prompt_idx=p.index, prompt_len=len(p.token_ids), output_len=len(dec["token_ids"]),
        conversation=p.conversation, turn=p.turn,
        match=cmp.match, first_divergence=cmp.first_divergence, max_logprob_diff=cmp.max_logprob_diff,
        near_tie=cmp.near_tie, prefill_token_match=pre["token_ids"][:1] == base["token_ids"][:1],
        error=error, base_ttft_ms=base["ttft_ms"], base_e2e_ms=base["e2e_ms"],
        prefill_ms=(pre["finished_t"] - t0) * 1e3, prefill_ttft_ms=prefill_ttft,
        prefill_ttft_overhead_ms=prefill_ttft - base["ttft_ms"], ttft_ms=ttft, e2e_ms=(dec["finished_t"] - t0) * 1e3,
        ttft_overhead_ms=ttft - base["ttft_ms"], after_forward_ms=after_forward_ms,
        **t, **ttft_overhead_parts(t, base["ttft_ms"], kv_gated(settings.early, recv)),
        fault=send.fault if send is not None else None,
        aborted="+".join(n for n, r in zip(("prefill", "decode"), results) if r.get("finish_reason") == "abort")
        or None,
        token_ids=dec["token_ids"], base_token_ids=base["token_ids"],
        task_score=task_score(dec["token_ids"], p.reference), base_task_score=base.get("task_score"))


class RunRows:
    """A run's rows as its passes finish prompts: the baseline's by prompt index (the P/D rows
    compare against them), whether its second pass matched it (run.baseline_repeat), and the P/D
    path's rows; each written to its file at once."""

    def __init__(self, settings: Settings, run_dir: Path, run_id: str):
        self.settings, self.run_id = settings, run_id
        self.base: dict[int, dict] = {}
        self.self_match: list[bool] = []  # the baseline's second pass against its first, per prompt
        self.control_match: list[bool] = []  # run.no_transfer_control: the decode engine alone against the baseline
        self.requests: list[dict] = []
        self.base_out = JsonlWriter(run_dir / "baseline.jsonl")
        self.req_out = JsonlWriter(run_dir / "requests.jsonl")

    def add_baseline(self, p: Prompt, t0: float, results: list[dict]) -> dict:
        self.base[p.index] = baseline_row(self.run_id, p, t0, results)
        self.base_out.write(self.base[p.index])
        return self.base[p.index]

    def add_repeat(self, p: Prompt, t0: float, results: list[dict], out: JsonlWriter) -> None:
        row = baseline_row(self.run_id, p, t0, results)
        out.write(row)
        self.self_match.append(row["token_ids"] == self.base[p.index]["token_ids"])

    def add_control(self, p: Prompt, t0: float, results: list[dict], out: JsonlWriter) -> None:
        row = baseline_row(self.run_id, p, t0, results)
        out.write(row)
        self.control_match.append(row["token_ids"] == self.base[p.index]["token_ids"])

    def add_request(self, p: Prompt, t0: float, results: list[dict], stats: TransferStats, transfer_id: str) -> None:
        row = disagg_row(self.settings, self.run_id, p, t0, results, self.base[p.index], stats, transfer_id)
        self.requests.append(row)
        self.req_out.write(row)

    def close(self) -> None:
        self.base_out.close()
        self.req_out.close()
