"""The connector's counters in each instance's /metrics, through vLLM's own connector-stats hooks,
so that a Prometheus deployment sees them without the harness:

    vllm:kv_harness_transfers_total         transfers this engine's workers recorded (sent or received)
    vllm:kv_harness_bytes_total             their payload bytes
    vllm:kv_harness_transfer_seconds_total  their time (the sender's gpu_ms or send_ms, the receiver's transfer_ms)
    vllm:kv_harness_tokens_total            the prompt tokens whose KV they carried (sent, or received; not
                                            a failed one's), beside vLLM's own prompt_tokens_by_source
    vllm:kv_harness_failed_transfers_total  transfers that failed (a receive whose KV did not come, ...)
    vllm:kv_harness_faults_total            transfers that carried an injected fault (scenario.fault)

each labelled with the engine (model_name, engine) as vLLM's own metrics are. A worker counts each
record it writes (recorder.py); vLLM collects the counts after every step
(`get_kv_connector_stats`), sums them over the workers and steps (`aggregate`) and hands them to
its Prometheus logger in the API server (`build_prom_metrics`, `observe`) and its periodic log
line ("KV Transfer metrics: ..."); a transfer recorded off the steps (a request whose every block
was in the decode engine's prefix cache, its message in after it was scheduled) is counted with
the engine's next step. Digest failures are not among them: a transfer's digests are
judged by joining both sides' records, which no one engine has.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats

COUNTS = ("transfers", "bytes", "transfer_s", "tokens", "failed", "faults")
DOCS = {"transfers": ("kv_harness_transfers", "KV transfers this engine recorded"),
        "bytes": ("kv_harness_bytes", "payload bytes of those transfers"),
        "transfer_s": ("kv_harness_transfer_seconds", "transfer time of those transfers"),
        "tokens": ("kv_harness_tokens", "prompt tokens whose KV those transfers carried"),
        "failed": ("kv_harness_failed_transfers", "KV transfers that failed"),
        "faults": ("kv_harness_faults", "KV transfers that carried an injected fault")}


@dataclass
class TransferCounts(KVConnectorStats):
    """Counts since vLLM last took them: data {name: number} for each of COUNTS."""

    def __post_init__(self):
        for k in COUNTS:
            self.data.setdefault(k, 0)

    def reset(self):
        self.data = dict.fromkeys(COUNTS, 0)

    def aggregate(self, other: KVConnectorStats) -> TransferCounts:
        for k in COUNTS:
            self.data[k] += other.data.get(k, 0)
        return self

    def reduce(self) -> dict[str, int | float]:
        return dict(self.data)

    def is_empty(self) -> bool:
        return not any(self.data.values())


class Tally:
    """A worker's counts, added to by the thread that writes its records and taken by vLLM's step."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counts = TransferCounts()

    def add(self, record) -> None:
        with self._lock:
            c = self._counts.data
            c["transfers"] += 1
            c["bytes"] += record.bytes or 0
            # the sender's time on the GPU's clock where there is one, else its host's; the receiver's transfer_ms
            ms = next((v for v in (record.gpu_ms, record.send_ms, record.transfer_ms) if v is not None), 0.0)
            c["transfer_s"] += ms / 1e3
            c["tokens"] += 0 if record.error is not None else record.tokens
            c["failed"] += record.error is not None
            c["faults"] += record.fault is not None

    def take(self) -> TransferCounts | None:
        """The counts since the last take (None when there are none: vLLM then sends nothing)."""
        with self._lock:
            if self._counts.is_empty():
                return None
            taken, self._counts = self._counts, TransferCounts()
            return taken


class TransferPromMetrics(KVConnectorPromMetrics):
    """Prometheus counters, one per count and engine, which `observe` advances."""

    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self.counters = {}
        for k, (name, doc) in DOCS.items():
            counter = self._counter_cls(name=f"vllm:{name}", documentation=doc, labelnames=labelnames)
            self.counters[k] = {idx: counter.labels(*values) for idx, values in per_engine_labelvalues.items()}

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0):
        for k, by_engine in self.counters.items():
            v = transfer_stats_data.get(k, 0)
            if v:
                by_engine[engine_idx].inc(v)
