"""runner=serve's rows (records/schema.py ServeRow), one per request as the client saw it, checked
against the baseline's answer to the same request and joined with its transfer's records
(records/join.py); written as each request ends (RowWriter), so a run stopped halfway keeps what
it measured."""

from __future__ import annotations

import queue
import threading
import time

from harness.records.accuracy import task_score
from harness.records.compare import compare_outputs
from harness.records.files import JsonlWriter
from harness.records.join import kv_gated, path_parts, record_stamps, transfer_fields
from harness.records.schema import DECODE_ONLY, HANDOVER_PATH, ServeRow
from harness.records.serve_summary import coalesced
from harness.records.transfer_records import TransferStats
from harness.serving.load import ClientResult
from harness.settings import Settings
from harness.workload import Prompt


def ms(t: float | None) -> float | None:
    return None if t is None else t * 1e3


def row(settings: Settings, run_id: str, path: str, r: ClientResult, p: Prompt, base: ClientResult | None,
        stats: TransferStats | None, rate: float, repeat: int = 0) -> dict:
    cfg, ok = settings.cfg, r.status == "ok"
    ttft = r.t_first * 1e3 if r.t_first is not None else None
    e2e = r.t_done * 1e3 if ok else None
    tpot = (e2e - ttft) / (len(r.token_ids) - 1) if ok and len(r.token_ids) > 1 else None
    itl = [(b - a) * 1e3 for a, b in zip(r.token_times, r.token_times[1:])]
    bursts = coalesced(itl, cfg.serve.coalesced_gap_ms) if ok else None
    meets = None
    if ok:
        meets = all(limit is None or value is not None and value <= limit
                    for value, limit in ((ttft, cfg.slo.ttft_ms), (tpot, cfg.slo.tpot_ms)))
    cmp = None
    if ok and base is not None and base.status == "ok":
        cmp = compare_outputs(base.token_ids, r.token_ids, base.logprobs, r.logprobs, base.top_ids, r.top_ids)
    send = recv = digest_match = None
    joined = transfer_fields(None, None, None)
    if stats is not None and r.transfer_id and r.route != DECODE_ONLY:
        # a request the client abandoned may have left before its KV was taken: no receive record to wait for
        send, recv, digest_match = stats.take_transfer(r.transfer_id, received=r.status == "ok")
        joined = transfer_fields(send, recv, digest_match, stats.take(r.transfer_id, "prefill"),
                                 stats.take(r.transfer_id, "decode"))
    parts = handover(settings, r, send, recv) if ok and path.startswith("disagg") else None
    return ServeRow(
        **ServeRow.known(joined),
        run_id=run_id, strategy=cfg.strategy.name, model=cfg.model.name, workload=cfg.workload.name,
        device=settings.device,
        path=path, request_idx=r.index, prompt_idx=r.prompt_idx, prompt_len=r.prompt_len,
        output_len=len(r.token_ids), conversation=p.conversation, turn=p.turn, status=r.status, error=r.error,
        request_rate=rate, arrival_s=r.arrival_s,
        sent_s=r.t_sent, ttft_ms=ttft, prefill_ttft_ms=ms(r.t_prefill_token), decode_ttft_ms=ms(r.t_decode_token),
        tpot_ms=tpot, e2e_ms=e2e, itl_ms=itl, coalesced=bursts, meets_slo=meets,
        match=cmp.match if cmp else None, first_divergence=cmp.first_divergence if cmp else None,
        max_logprob_diff=cmp.max_logprob_diff if cmp else None, near_tie=cmp.near_tie if cmp else None,
        transfer_id=r.transfer_id, route=r.route, repeat=repeat,
        base_ttft_ms=(base.t_first * 1e3 if path.startswith("disagg") and base is not None and base.t_first is not None
                      else None),
        **{f"handover_{part}_ms": parts[part] if parts else None for part, _ in HANDOVER_PATH},
        token_ids=r.token_ids, fault=r.fault, aborted="client" if r.aborted else None,
        task_score=task_score(r.token_ids, p.reference) if ok else None)


def handover(settings: Settings, r: ClientResult, send, recv) -> dict[str, float] | None:
    """The P/D request's time to the decode instance's first token at the client, cut along
    HANDOVER_PATH on one clock: the client's, the router's `routed` stamp and the connectors'
    records (harness/records/join.py path_parts). None where a stamp is missing (vLLM's connectors,
    endpoints not through the project's router) or where the KV did not gate the first token."""
    streamed = settings.cfg.serve.stream_prefill_token
    first = r.t_decode_token if r.t_decode_token is not None else None if streamed else r.t_first
    if r.t_origin is None or r.t_routed is None or first is None:
        return None
    t = {f"t_{e}_ms": None if v is None else (v - r.t_origin) * 1e3 for e, v in record_stamps(send, recv).items()}
    t.update(t_routed_ms=r.t_routed * 1e3, t_first_token_ms=first * 1e3)
    return path_parts(t, HANDOVER_PATH, kv_gates_first_token=kv_gated(settings.early, recv))


class RowWriter:
    """Writes each request's row as soon as it ends, so that a run stopped halfway keeps what it
    measured. A thread of its own: a P/D row waits (up to wait_s) for its transfer records,
    which the workers append a moment after the client has its answer (a faulted request's
    even when it failed: they say why). A row that cannot be made stops nothing else: the rest
    are written, and close() raises the first such error, so that the run fails saying why
    rather than quietly keeping fewer rows than it sent requests."""

    def __init__(self, out: JsonlWriter, make_row, stats: TransferStats | None, wait_s: float = 5.0):
        self.out, self.make_row, self.stats, self.wait_s = out, make_row, stats, wait_s
        self.queue: queue.Queue = queue.Queue()
        self.abandon = threading.Event()  # the run is stopping: no more waiting for records
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, name="row-writer", daemon=True)
        self.thread.start()

    def put(self, result: ClientResult) -> None:
        self.queue.put(result)

    def _loop(self) -> None:
        while (r := self.queue.get()) is not None:
            if self.stats is not None and r.transfer_id and r.route != DECODE_ONLY and (r.status == "ok" or r.fault):
                deadline = time.monotonic() + self.wait_s
                while not self.stats.has_both(r.transfer_id) and time.monotonic() < deadline \
                        and not self.abandon.is_set():
                    time.sleep(0.01)
            try:
                self.out.write(self.make_row(r))
            except Exception as e:  # noqa: BLE001 - said by close(), after the other rows are written
                self.error = self.error or e

    def close(self, abandon: bool = False) -> None:
        if abandon:
            self.abandon.set()
        self.queue.put(None)
        self.thread.join()
        if self.error is not None and not abandon:
            raise RuntimeError(f"a row could not be written: {self.error!r}") from self.error
