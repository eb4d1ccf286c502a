"""The digests leave the engines' steps: a worker queues them on the device and a thread of its
own writes the transfer record once they are in (records.RecordQueue). Nothing put is lost, a
record is complete when the harness can read it, and the digests are of the blocks as they were
when launched."""

import threading

import torch

from harness.records.transfer_records import TransferRecordReader
from transfer_strategies.connector_config import HarnessSettings
from transfer_strategies.records import RecordQueue, TransferRecord, TransferRecordWriter
from transfer_strategies.scheduler import Asked, TransferRequest
from transfer_strategies.worker import TransferWorker


def a_record(tid: str = "t") -> TransferRecord:
    return TransferRecord(transfer_id=tid, side="send", strategy="x", blocks=1, skip_blocks=0, tokens=4,
                          kv_cache_blocks=8, kv_cache_bytes=0, bytes=0, messages=1)


class Pending:
    """Digests the device has not finished: result() blocks until released (or raises)."""

    def __init__(self, fail: bool = False):
        self.done, self.fail, self.ms = threading.Event(), fail, None

    def result(self):
        self.done.wait()
        if self.fail:
            raise RuntimeError("device lost")
        self.ms = 0.25
        return {"all": ["00ff"]}

    def fill(self, record):
        record.digests = self.result()
        record.digest_ms = self.ms


def test_a_record_is_written_once_its_digests_are_in_and_flush_waits_for_it(tmp_path):
    path = tmp_path / "r.jsonl"
    records, writer, reader = RecordQueue(), TransferRecordWriter(path), TransferRecordReader(path)
    slow = Pending()
    records.put(writer, a_record("slow"), [slow])  # returns at once: the step goes on
    records.put(writer, a_record("plain"))  # nothing pending: written now
    assert [r.transfer_id for r in reader.read_new()] == ["plain"]
    slow.done.set()
    records.flush()
    (written,) = reader.read_new()
    assert written.transfer_id == "slow" and written.digests == {"all": ["00ff"]} and written.digest_ms == 0.25


def test_digests_that_fail_leave_a_record_that_says_so(tmp_path):
    path = tmp_path / "r.jsonl"
    records = RecordQueue()
    broken = Pending(fail=True)
    broken.done.set()
    records.put(TransferRecordWriter(path), a_record(), [broken])
    records.flush()
    (written,) = TransferRecordReader(path).read_new()
    assert written.digests is None and "device lost" in written.error


def test_a_workers_digests_are_of_the_blocks_when_launched_and_in_its_file_once_it_reports(tmp_path):
    cache = {f"layer.{i}": torch.randn(8, 2, 4, 8) for i in range(3)}  # the CPU backend's layout
    w = TransferWorker("FusedConnector", True, HarnessSettings(stats_path=str(tmp_path / "prefill-transfers.jsonl")))
    w.attach(cache, 8)
    expected = w.recorder.digests([2, 5])
    w.recorder.record(TransferRequest("t", "r", [2, 5], num_tokens=8), "send")
    for layer in cache.values():  # a later forward pass writes into the blocks
        layer[[2, 5]] = 0
    w.held()  # what the harness asks once every request ended: flushes the records first
    (written,) = TransferRecordReader(tmp_path / "prefill-transfers.jsonl").read_new()
    assert written.digests == expected and written.digest_ms is not None


def test_a_request_that_names_its_records_file_has_its_record_written_there(tmp_path):
    """Engines kept between runs (harness/offline/engine_pool.py): each run's requests name
    their own run's file; a request naming none goes to the connector's default."""
    cache = {f"layer.{i}": torch.randn(8, 2, 4, 8) for i in range(3)}
    w = TransferWorker("FusedConnector", True,
                       HarnessSettings(stats_path=str(tmp_path / "first" / "prefill-transfers.jsonl")))
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    w.attach(cache, 8)
    second = tmp_path / "second" / "prefill-transfers.jsonl"
    w.recorder.record(TransferRequest("t1", "r1", [2], num_tokens=8), "send")
    w.recorder.record(TransferRequest("t2", "r2", [5], num_tokens=8, asked=Asked(records=str(second))), "send")
    w.held()
    first = TransferRecordReader(tmp_path / "first" / "prefill-transfers.jsonl").read_new()
    assert [r.transfer_id for r in first] == ["t1"]
    assert [r.transfer_id for r in TransferRecordReader(second).read_new()] == ["t2"]
