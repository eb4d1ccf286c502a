"""The serving runner's load: when each request is sent (the arrival schedule) and what the
client sees of it (every token's arrival time, the token ids and their log-probabilities).

    schedule = arrival_schedule(spec, prompts)            # the same seed: the same schedule
    results = asyncio.run(send_all(url, model, schedule, max_tokens=16, max_concurrency=None))

Arrivals follow vLLM's `vllm bench serve`: gaps drawn from a gamma distribution with shape
`burstiness` and mean 1/rate (burstiness 1 is Poisson, below 1 burstier, above 1 steadier),
or constant gaps; rate inf sends everything at once. A maximum concurrency holds a request back
until one in flight ends. A request that follows another (a conversation's next turn) is sent
once that one has ended, whatever its own arrival time. Requests are streamed (/v1/completions
with token ids in and out), so the client measures TTFT and every inter-token gap itself, as a
user's client would. A scenario's requests may carry a transport fault (the X-KV-Fault header,
which the project's router passes on) or be abandoned by the client at a set time (an abort: the
router aborts them upstream).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import aiohttp
import numpy as np

from harness.records.serve_summary import TIMED_OUT
from harness.serving.arrivals import ArrivalError, poisson
from harness.serving.selective import ROUTE_HEADER


class LoadError(ValueError):
    pass


@dataclass
class LoadSpec:
    request_rate: float  # requests per second; inf: all at once
    # the gaps between requests at a rate, from a seeded generator (arrivals.py; conf/arrivals/)
    arrivals: Callable[[float, np.random.Generator], Iterator[float]] = poisson
    num_requests: int | None = 16
    duration_s: float | None = None
    max_concurrency: int | None = None
    seed: int = 0
    cancel_fraction: float = 0.0  # of requests the client abandons right after their first token
    # a rate that moves from start to end over the requests, as `vllm bench serve --ramp-up-strategy`
    # (linear | exponential; request i at progress i / (n - 1)); request_rate is then not used
    ramp_up: str | None = None
    ramp_up_start_rps: float | None = None
    ramp_up_end_rps: float | None = None

    def rate_at(self, i: int) -> float:
        """The rate request i arrives at: request_rate, or the ramp's at its place."""
        if self.ramp_up is None:
            return self.request_rate
        start, end = self.ramp_up_start_rps, self.ramp_up_end_rps
        progress = i / max(self.num_requests - 1, 1)
        return start + (end - start) * progress if self.ramp_up == "linear" else start * (end / start) ** progress

    def check(self) -> None:
        if self.ramp_up is not None:
            if self.ramp_up not in ("linear", "exponential"):
                raise LoadError(f"serve.ramp_up must be linear, exponential or null, got {self.ramp_up!r}")
            for name in ("ramp_up_start_rps", "ramp_up_end_rps"):
                v = getattr(self, name)
                if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < math.inf:
                    raise LoadError(f"serve.ramp_up={self.ramp_up} needs serve.{name} > 0 and finite, got {v!r}")
            if self.num_requests is None:
                raise LoadError("serve.ramp_up moves the rate over serve.num_requests: give it (not duration_s)")
        if not self.request_rate > 0:
            raise LoadError(f"serve.request_rate must be > 0 (inf: all at once), got {self.request_rate}")
        try:  # the pattern's own parameters: its first gap
            next(self.arrivals(1.0, np.random.default_rng(0)))
        except (ArrivalError, TypeError) as e:
            raise LoadError(f"arrivals: {e}") from None
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise LoadError(f"serve.max_concurrency must be >= 1 (null: no limit), got {self.max_concurrency}")
        if (self.num_requests is None) == (self.duration_s is None):
            raise LoadError("give one of serve.num_requests and serve.duration_s (the other null)")
        if self.num_requests is not None and self.num_requests < 1:
            raise LoadError(f"serve.num_requests must be >= 1, got {self.num_requests}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise LoadError(f"serve.duration_s must be > 0, got {self.duration_s}")
        if self.duration_s is not None and math.isinf(self.request_rate):
            raise LoadError("serve.duration_s needs a finite serve.request_rate (inf sends everything at once)")
        if not 0 <= self.cancel_fraction < 1:
            raise LoadError(f"serve.cancel_fraction must be in [0, 1), got {self.cancel_fraction}")


@dataclass
class ScheduledRequest:
    index: int  # the request's place in the schedule
    prompt_idx: int  # the workload prompt it sends (prompts are reused in order)
    token_ids: list[int]
    arrival_s: float  # when it is due, from the start of the load
    cancel: bool = False  # the client goes away after the first token
    # the request (by index) that must have ended before this one is sent: its conversation's
    # previous turn, whose answer its prompt continues (token_ids then come at sending: send_all)
    follows: int | None = None
    fault: dict | None = None  # a scenario's transport fault for its transfer (harness/scenario.py fault_for)
    abort_after_s: float | None = None  # a scenario's abort: the client goes away this long after sending
    max_tokens: int | None = None  # its own output length (a trace's); None: send_all's
    route: str | None = None  # the route it asks the project's router for (X-PD-Route: decode_only, the control)


def arrival_schedule(spec: LoadSpec, prompts: list[list[int]]) -> list[ScheduledRequest]:
    """Request i sends prompt i mod len(prompts) at its arrival time; seeded, so the baseline and
    the P/D path get the same schedule."""
    spec.check()
    rng = np.random.default_rng(spec.seed)
    if spec.ramp_up is not None:  # the pattern's gaps at 1 req/s, each scaled to its request's rate
        unit = spec.arrivals(1.0, rng)
        gaps = (next(unit) / spec.rate_at(i) for i in itertools.count(1))
    else:
        gaps = None if math.isinf(spec.request_rate) else spec.arrivals(spec.request_rate, rng)

    def gap() -> float:
        return 0.0 if gaps is None else next(gaps)

    times, t = [], 0.0
    while True:
        if spec.num_requests is not None and len(times) == spec.num_requests:
            break
        if spec.duration_s is not None and t >= spec.duration_s:
            break
        times.append(t)
        t += gap()
    cancel_rng = np.random.default_rng(spec.seed + 1)
    cancels = cancel_rng.random(len(times)) < spec.cancel_fraction
    return [ScheduledRequest(i, i % len(prompts), list(prompts[i % len(prompts)]), a, bool(c))
            for i, (a, c) in enumerate(zip(times, cancels, strict=True))]


@dataclass
class ClientResult:
    """One request as the client saw it; times in seconds on time.monotonic()."""

    index: int
    prompt_idx: int
    prompt_len: int
    arrival_s: float
    t_sent: float
    t_first: float | None = None
    t_done: float | None = None
    t_prefill_token: float | None = None  # the router had the prefill instance's answer (its mark)
    t_decode_token: float | None = None  # the decode instance's first token reached the router (its mark)
    t_routed: float | None = None  # the router posted the prefill request (its `: routed` stamp)
    t_origin: float | None = None  # when the client posted it, on time.monotonic(): the times above count from it
    token_times: list[float] = field(default_factory=list)  # when each output token arrived
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_ids: list[list[int]] = field(default_factory=list)  # each position's top-k token ids, best first
    transfer_id: str | None = None
    route: str | None = None  # the project's P/D router's X-PD-Route: disagg or decode_only
    status: str = "ok"  # ok | failed | cancelled (cancel or abort: the client went away)
    error: str | None = None
    fault: str | None = None  # the kind of transport fault the request asked for
    aborted: bool = False  # abandoned at its abort_after_s, before it ended


def top_ids(top_logprobs: dict[str, float] | None) -> list[int]:
    """One position's top token ids, best first, from the completions API's top_logprobs as
    vLLM's return_tokens_as_token_ids writes them ({"token_id:1475": -2.6, ...}); empty (top-k
    unknown: no near tie told) from a server that wrote token strings instead."""
    ranked = sorted((top_logprobs or {}).items(), key=lambda kv: -kv[1])
    if not all(t.startswith("token_id:") for t, _ in ranked):
        return []
    return [int(t.removeprefix("token_id:")) for t, _ in ranked]


async def send_one(session: aiohttp.ClientSession, url: str, model: str, req: ScheduledRequest, max_tokens: int,
                   request_id: str, t_start: float, logprobs: int = 2) -> ClientResult:
    """logprobs: top-k per token (k >= 2 tells a near tie from a mismatch, harness/records/compare.py)."""
    body = {"model": model, "prompt": req.token_ids, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "logprobs": logprobs, "return_token_ids": True,
            "return_tokens_as_token_ids": True}
    res = ClientResult(req.index, req.prompt_idx, len(req.token_ids), req.arrival_s, time.monotonic() - t_start,
                       fault=(req.fault or {}).get("kind"))
    headers = {"X-Request-Id": request_id, "X-Router-Marks": "1"}  # marks: the project's router's, on P/D
    if req.fault:
        headers["X-KV-Fault"] = json.dumps(req.fault)
    if req.route:
        headers[ROUTE_HEADER] = req.route
    exchange = asyncio.ensure_future(_exchange(session, url + "/v1/completions", body, headers, req, max_tokens, res))
    done, _ = await asyncio.wait({exchange}, timeout=req.abort_after_s)
    if not done:  # leaving the request's context closes the connection: the router aborts upstream
        exchange.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await exchange
        res.status, res.aborted = "cancelled", True
        return res
    return exchange.result()


async def _exchange(session: aiohttp.ClientSession, url: str, body: dict, headers: dict, req: ScheduledRequest,
                    max_tokens: int, res: ClientResult) -> ClientResult:
    """The request's stream into res, as it comes."""
    t0 = res.t_origin = time.monotonic()
    try:
        async with session.post(url, json=body, headers=headers) as r:
            res.transfer_id, res.route = r.headers.get("X-Transfer-Id"), r.headers.get(ROUTE_HEADER)
            if r.status != 200:
                res.status, res.error = "failed", f"HTTP {r.status}: {(await r.text())[:300]}"
                return res
            async for line in r.content:  # one SSE line at a time
                now = time.monotonic()
                line = line.strip()
                if line == b": prefill-token":
                    res.t_prefill_token = now - t0
                elif line == b": decode-token":
                    res.t_decode_token = now - t0
                elif line.startswith(b": routed "):
                    res.t_routed = float(line[9:]) - t0
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("error"):
                    res.status, res.error = "failed", str(chunk["error"])[:300]
                    return res
                choice = chunk["choices"][0]
                ids = choice.get("token_ids") or []
                if not ids:
                    continue
                res.token_ids += ids
                lp = choice.get("logprobs") or {}
                res.logprobs += list(lp.get("token_logprobs") or [None] * len(ids))
                res.top_ids += [top_ids(t) for t in lp.get("top_logprobs") or [None] * len(ids)]
                res.token_times += [now - t0] * len(ids)
                if res.t_first is None:
                    res.t_first = now - t0
                    if req.cancel:
                        res.status = "cancelled"
                        return res  # leaving the context closes the connection: the router aborts upstream
        res.t_done = time.monotonic() - t0
        if len(res.token_ids) != max_tokens:
            res.status, res.error = "failed", f"{len(res.token_ids)} tokens of {max_tokens}"
    except asyncio.TimeoutError:
        res.status, res.error = "failed", TIMED_OUT
    except aiohttp.ClientError as e:
        res.status, res.error = "failed", f"{type(e).__name__}: {e}"[:300]
    return res


NO_PREVIOUS_ANSWER = "its conversation's previous turn has no answer to continue"


async def send_all(url: str, model: str, schedule: list[ScheduledRequest], *, max_tokens: int,
                   max_concurrency: int | None, timeout_s: float, id_prefix: str, logprobs: int = 2,
                   on_result=None, watchdog=None,
                   turn_ids: Callable[[ScheduledRequest], list[int]] | None = None) -> list[ClientResult]:
    """Every request of the schedule, each at its arrival time (later if max_concurrency requests
    are in flight), a request that follows another once that one has ended and on_result has
    seen it. on_result(result) as each ends; turn_ids(request): a following request's token ids
    (empty: its prompt could not be built, it fails unsent); watchdog() is awaited beside the
    load and ends it by raising (an instance died)."""
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    results: list[ClientResult] = []
    ended = {r.index: asyncio.Event() for r in schedule}
    t_start = time.monotonic()

    async def one(session, req):
        delay = t_start + req.arrival_s - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        if req.follows is not None:
            await ended[req.follows].wait()
            req = dataclasses.replace(req, token_ids=list(turn_ids(req)))
        if not req.token_ids:
            res = ClientResult(req.index, req.prompt_idx, 0, req.arrival_s, time.monotonic() - t_start,
                               status="failed", error=NO_PREVIOUS_ANSWER)
        else:
            async with limit or contextlib.nullcontext():
                res = await send_one(session, url, model, req, req.max_tokens or max_tokens,
                                     f"{id_prefix}-{req.index}", t_start, logprobs)
        results.append(res)
        if on_result is not None:
            on_result(res)
        ended[req.index].set()

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        load = asyncio.ensure_future(asyncio.gather(*(one(session, r) for r in schedule)))
        guard = asyncio.ensure_future(watchdog()) if watchdog else None
        try:
            if guard is None:
                await load
            else:
                await asyncio.wait({load, guard}, return_when=asyncio.FIRST_COMPLETED)
                if guard.done():
                    guard.result()  # raises what stopped the load
                load.result()
        finally:
            for task in (load, guard):
                if task is not None and not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):  # its end is not ours
                        await task
    return sorted(results, key=lambda r: r.index)

