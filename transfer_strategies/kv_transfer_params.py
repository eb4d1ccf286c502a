"""What a request to this project's connectors carries in vLLM's `kv_transfer_params`: the keys the
harness and the router write and the scheduler side reads, in one module that imports neither vLLM
nor torch (the harness judges its configuration before it imports either)."""

from __future__ import annotations

TRANSFER_ID = "transfer_id"  # both requests of one prompt: the prefill's send and the decode's receive meet by it
LOAD = "load"
ASYNC_LOAD = "async"  # LOAD of a decode request submitted before its KV exists (early submission)
# the file this request's transfer records go to (rank 0's; records.rank_path, records.compute_path
# beside it), so that engines kept between runs write each run's records into its own directory;
# absent: the connector's harness.stats_path
RECORDS = "records"
# a decode request whose KV its worker damages once received (the negative control, check.corrupt),
# so that one engine pair serves the real and the corrupted runs
CORRUPT = "corrupt"
# a prefill request whose transfer its worker damages or holds back on purpose, {"kind": one of
# FAULT_KINDS, "delay_s": for delay}: a scenario's transport fault (faults.py), chosen per request
# by the harness, so that one engine pair serves the real and the faulted runs
FAULT = "fault"
FAULT_KINDS = ("drop", "delay", "truncate", "flip")
# a prefill request's decode instance, by its place in the prefill worker's list of KV channels
# (the router's --decode order): a prefill instance that pushes to several decode instances
# (1P2D, 2P2D) sends the KV to the one the router chose for the request's decode half
PEER = "peer"


def push_params(transfer_id: str, early: bool = False, records: str | None = None, corrupt: bool = False,
                fault: dict | None = None, peer: int | None = None) -> dict:
    """kv_transfer_params of a request to a push strategy's engine; early: a decode request sent
    with the prefill request, parked in vLLM until its KV is in; corrupt: a decode request whose
    KV is damaged on arrival (the negative control); fault: a prefill request whose transfer
    carries a scenario's transport fault; peer: a prefill request's decode instance (PEER)."""
    params = {TRANSFER_ID: transfer_id, LOAD: ASYNC_LOAD} if early else {TRANSFER_ID: transfer_id}
    if records is not None:
        params[RECORDS] = records
    if corrupt:
        params[CORRUPT] = True
    if fault:
        params[FAULT] = fault
    if peer is not None:
        params[PEER] = peer
    return params


def transfer_id_of(params: dict | None) -> str | None:
    return (params or {}).get(TRANSFER_ID)


def records_of(params: dict | None) -> str | None:
    return (params or {}).get(RECORDS)


def fault_of(params: dict | None) -> tuple[str | None, float | None]:
    """(kind, delay_s) of the transport fault a prefill request asks for ((None, None): none)."""
    fault = (params or {}).get(FAULT) or {}
    return fault.get("kind"), fault.get("delay_s")


def peer_of(params: dict | None) -> int | None:
    """The decode instance a prefill request's KV goes to (None: not said)."""
    peer = (params or {}).get(PEER)
    return peer if isinstance(peer, int) and not isinstance(peer, bool) else None


def corrupts(params: dict | None) -> bool:
    return bool((params or {}).get(CORRUPT))


def loads_async(params: dict | None) -> bool:
    return (params or {}).get(LOAD) == ASYNC_LOAD
