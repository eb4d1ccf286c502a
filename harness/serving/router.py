"""A small async HTTP router in front of prefill and decode `vllm serve` instances (issue 13):
the kind a user deploys to try disaggregated serving, usable on its own.

    python -m harness.serving.router --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200 --port 8000

Each completion request goes to a prefill instance with max_tokens=1 and to a decode instance,
whose answer (streamed or whole) goes back to the client. How the KV gets from one to the other
is the connectors' business; the router only carries what ties the two requests together:
- push (this project's strategies): both requests carry one transfer id in kv_transfer_params.
  `early` submission (the default) sends both at once and the decode instance parks its request
  until the KV is in; `after_prefill` sends the decode request when the prefill answered. With
  several decode instances the prefill request also names the one chosen (its place in the
  --decode list, which must be the order of each prefill instance's KV channels).
- relay (vLLM's NIXL connectors): the prefill request asks the instance to keep the KV for a remote
  decode (do_remote_decode); its answer's kv_transfer_params go with the decode request, both
  with the transfer id for the observer beside NIXL (transfer_strategies/observer.py).
- bootstrap (vLLM's Mooncake connector): as relay, but the decode request names the prefill
  instance up front: its engine id (asked once of its bootstrap server, --bootstrap, at /query) and
  that server's URL; its workers then write the KV into the decode instance's blocks.
With several instances per side it picks by round robin, by fewest outstanding requests, or by
the prompt's first tokens (prefix_hash: a shared prefix meets its prefix cache), each side its own.
--pd-policy selective sends short or mostly cached prompts to the decode instance alone
(harness/serving/selective.py); every P/D answer says its route in X-PD-Route (disagg, decode_only),
and a client may ask for one with the same header (the harness's no-transfer control: decode_only).
Without prefill instances it is a plain load balancer over the others (colocated instances
behind the same proxy, so that a comparison with P/D pays the same hop).
A client's X-Request-Id header becomes the transfer id (the connectors' records carry it) and the
request id on both instances (as vLLM's proxy sends: its NIXL push connector pairs them by it); the
answer names it in X-Transfer-Id. A client gone away closes the upstream requests (vLLM aborts them).

--stream-prefill-token: a streamed answer starts with the prefill instance's token as soon as
the prefill answered, so that the client's TTFT is the prefill's; the decode instance computes
the same token again (greedy), and the router drops that duplicate from its stream (a decode
token that differs ends the stream with an error event: the two instances disagree).
A client that sends `X-KV-Fault: {"kind": "drop", ...}` (a push handoff) has that transport fault
injected into its request's transfer (the prefill request's kv_transfer_params carry it, as the
offline runner's do): the harness's fault scenarios under runner=serve. With `X-Router-Marks: 1` a streamed
P/D answer carries SSE comments (clients skip them): `: routed <t>` when the router posted the prefill request
(t: its time.monotonic(), which every process of a machine shares), `: prefill-token` when the prefill
answered and `: decode-token` before the decode instance's first token; the harness's handover decomposition.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid

import aiohttp
from aiohttp import web

from harness.records.schema import DECODE_ONLY, DISAGG
from harness.serving.first_token import prefill_token_chunk, sse, without_first_token
from harness.serving.pool import POLICIES, Pool
from harness.serving.selective import PD_POLICIES, ROUTE_HEADER, Selective
from harness.settings import HANDOFFS
from transfer_strategies.kv_transfer_params import FAULT_KINDS, push_params

MARKS, ID = "X-Router-Marks", "X-Request-Id"
FAULT_HEADER = "X-KV-Fault"


def fault_header(value: str) -> dict:
    """The transport fault a request's X-KV-Fault header asks for ({"kind": one of FAULT_KINDS,
    "delay_s": for delay}), or 400."""
    try:
        fault = json.loads(value)
    except json.JSONDecodeError:
        fault = None
    if not isinstance(fault, dict) or fault.get("kind") not in FAULT_KINDS:
        raise web.HTTPBadRequest(text=f"{FAULT_HEADER} must be a JSON object with a kind among "
                                      f"{', '.join(FAULT_KINDS)}, got {value[:200]!r}")
    return fault


def answer_headers(transfer_id: str, route: str | None) -> dict[str, str]:
    return {"X-Transfer-Id": transfer_id, **({ROUTE_HEADER: route} if route else {})}


class Router:
    def __init__(self, prefill: list[str], decode: list[str], policy: str = "round_robin", handoff: str = "push",
                 decode_submit: str = "early", timeout_s: float = 600.0, stream_prefill_token: bool = False,
                 corrupt: bool = False, prefill_policy: str | None = None, bootstrap: list[str] | None = None,
                 selective: Selective | None = None):
        """policy: how each side picks its instance; prefill_policy: the prefill side's instead
        (e.g. prefix_hash for prefill, least_outstanding for decode); bootstrap: each prefill
        instance's bootstrap server (a bootstrap handoff), in their order; selective: which
        requests skip the prefill instance (None: none do; harness/serving/selective.py)."""
        if handoff not in HANDOFFS:
            raise ValueError(f"unknown handoff {handoff!r}: one of {', '.join(HANDOFFS)}")
        if handoff == "bootstrap" and len(bootstrap or []) != len(prefill):
            raise ValueError("a bootstrap handoff needs a --bootstrap URL for each --prefill instance, in their order")
        if decode_submit not in ("early", "after_prefill"):
            raise ValueError(f"unknown decode_submit {decode_submit!r}: early or after_prefill")
        if handoff == "relay" and decode_submit == "early":
            raise ValueError("a relay handoff needs the prefill's answer first: decode_submit=after_prefill")
        self.prefill = Pool(prefill, prefill_policy or policy) if prefill else None
        self.decode = Pool(decode, policy)
        self.handoff, self.decode_submit = handoff, decode_submit
        self.bootstrap = dict(zip(self.prefill.urls, [b.rstrip("/") for b in bootstrap or []])) if prefill else {}
        self.engine_ids: dict[str, str] = {}  # a prefill instance's engine id, from its bootstrap server
        self.stream_prefill_token = stream_prefill_token
        self.selective = selective if prefill else None
        # the negative control: every decode request asks for its KV damaged (relay: by the observer)
        self.corrupt = corrupt
        # no progress (connecting, or between two reads) for timeout_s: a stream may last longer
        self.timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout_s, sock_read=timeout_s)
        self.session: aiohttp.ClientSession | None = None

    # ------------------------------------------------------------ the two requests
    def prefill_body(self, body: dict, transfer_id: str, fault: dict | None = None, d_url: str | None = None) -> dict:
        """d_url: the decode instance this request's decode half goes to; a push prefill instance
        sends the KV there (its place among --decode: the prefill worker's channels are in that order)."""
        if self.handoff != "push":
            params = {"do_remote_decode": True, **push_params(transfer_id)}
        else:
            peer = self.decode.urls.index(d_url) if d_url is not None and len(self.decode.urls) > 1 else None
            params = push_params(transfer_id, fault=fault, peer=peer)
        out = {**body, "max_tokens": 1, "stream": False, "kv_transfer_params": params}
        out.pop("stream_options", None)
        out.pop("max_completion_tokens", None)
        return out

    def decode_body(self, body: dict, transfer_id: str, prefill_answer: dict | None,
                    remote: dict | None = None) -> dict:
        """remote: where a bootstrap handoff's KV is (remote_engine_id, remote_bootstrap_addr)."""
        if self.handoff == "bootstrap":
            params = {"do_remote_prefill": True, **remote, **push_params(transfer_id, corrupt=self.corrupt)}
        elif self.handoff == "relay":
            params = (prefill_answer or {}).get("kv_transfer_params")
            if not params:
                raise web.HTTPBadGateway(text="the prefill instance returned no kv_transfer_params")
            params = {**params, **push_params(transfer_id, corrupt=self.corrupt)}
        else:
            params = push_params(transfer_id, early=self.decode_submit == "early", corrupt=self.corrupt)
        return {**body, "kv_transfer_params": params}

    async def _remote(self, p_url: str) -> dict:
        """A bootstrap handoff's kv_transfer_params naming the prefill instance p_url."""
        addr = self.bootstrap[p_url]
        if p_url not in self.engine_ids:
            try:
                async with self.session.get(addr + "/query") as r:
                    ranks = await r.json(content_type=None)
            except aiohttp.ClientError as e:
                raise web.HTTPBadGateway(text=f"bootstrap server {addr}: {type(e).__name__}: {e}") from None
            self.engine_ids[p_url] = ranks[min(ranks, key=int)]["engine_id"]  # data-parallel rank 0's
        return {"remote_engine_id": self.engine_ids[p_url], "remote_bootstrap_addr": addr}

    async def _prefill(self, url: str, path: str, body: dict) -> dict:
        try:
            async with self.session.post(url + path, json=body,
                                         headers={ID: body["kv_transfer_params"]["transfer_id"]}) as r:
                answer = await r.json(content_type=None)
                if r.status != 200:
                    raise web.HTTPBadGateway(text=f"prefill instance {url}: {r.status} {json.dumps(answer)[:500]}")
                return answer
        except aiohttp.ClientError as e:
            raise web.HTTPBadGateway(text=f"prefill instance {url}: {type(e).__name__}: {e}") from None

    # ------------------------------------------------------------ HTTP
    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        transfer_id = request.headers.get(ID) or f"router-{uuid.uuid4().hex}"
        fault = None
        if FAULT_HEADER in request.headers:
            if self.prefill is None or self.handoff != "push":
                raise web.HTTPBadRequest(text=f"{FAULT_HEADER}: faults are injected by this project's connectors "
                                              f"between prefill and decode instances (a push handoff)")
            fault = fault_header(request.headers[FAULT_HEADER])
        d_url = self.decode.pick(body)
        try:
            if self.prefill is None:  # colocated: one instance does both
                return await self._relay_decode(request, d_url, body, transfer_id)
            # a request asking for a transport fault has its KV moved, whatever the policy
            if fault is None and await self._route(d_url, body, request.headers.get(ROUTE_HEADER)) == DECODE_ONLY:
                return await self._relay_decode(request, d_url, body, transfer_id, route=DECODE_ONLY)
            p_url = self.prefill.pick(body)
            try:
                return await self._disagg(request, body, transfer_id, p_url, d_url, fault)
            finally:
                self.prefill.done(p_url)
        finally:
            self.decode.done(d_url)

    async def _route(self, d_url: str, body: dict, asked: str | None) -> str:
        """The client's X-PD-Route where it asks for one (the harness's no-transfer control), else the policy's."""
        if asked is not None:
            if asked not in (DISAGG, DECODE_ONLY):
                raise web.HTTPBadRequest(text=f"{ROUTE_HEADER} must be {DISAGG} or {DECODE_ONLY}, got {asked[:100]!r}")
            return asked
        if self.selective is None:
            return DISAGG
        try:
            return await self.selective.route(self.session, d_url, body)
        except aiohttp.ClientError as e:
            raise web.HTTPBadGateway(text=f"decode instance {d_url}: {type(e).__name__}: {e}") from None

    async def _disagg(self, request: web.Request, body: dict, transfer_id: str, p_url: str, d_url: str,
                      fault: dict | None = None):
        stream = bool(body.get("stream"))
        marks, first = stream and request.headers.get(MARKS) == "1", stream and self.stream_prefill_token
        out = None
        if marks or first:  # a stream of our own, begun now: the prefill's mark or token and the decode's lines go in
            out = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream",
                                                          **answer_headers(transfer_id, DISAGG)})
            await out.prepare(request)

        async def prefill_and_tell() -> dict:
            routed = time.monotonic()
            answer = await self._prefill(p_url, request.path, self.prefill_body(body, transfer_id, fault, d_url))
            if marks:
                await out.write(f": routed {routed:.6f}\n\n: prefill-token\n\n".encode())
            if first:
                await out.write(sse(prefill_token_chunk(answer)))
            return answer

        prefill = asyncio.ensure_future(prefill_and_tell())
        try:
            answer = None
            if self.decode_submit == "after_prefill":
                answer = await prefill
            remote = await self._remote(p_url) if self.handoff == "bootstrap" else None
            decode = asyncio.ensure_future(self._relay_decode(
                request, d_url, self.decode_body(body, transfer_id, answer, remote), transfer_id,
                out=out, after=prefill if out is not None else None, drop_first=first, marks=marks, route=DISAGG))
            try:
                # a failed prefill ends the decode request at once (else it would wait, parked, for KV
                # that never comes, until the connector's timeout)
                await asyncio.wait({prefill, decode}, return_when=asyncio.FIRST_EXCEPTION)
                if prefill.done() and prefill.exception() is not None:
                    raise prefill.exception()
                response = await decode
            finally:
                if not decode.done():
                    decode.cancel()
            await prefill
            return response
        except web.HTTPException as e:
            if out is None:
                raise
            # the stream has begun (status 200): the error goes in it, as vLLM reports errors mid-stream
            await out.write(sse({"error": {"message": e.text, "code": e.status}}) + b"data: [DONE]\n\n")
            await out.write_eof()
            return out
        finally:
            if not prefill.done():  # the client went away, or the decode side failed: abort upstream
                prefill.cancel()

    async def _relay_decode(self, request: web.Request, url: str, body: dict, transfer_id: str,
                            out: web.StreamResponse | None = None, after: asyncio.Future | None = None,
                            drop_first: bool = False, marks: bool = False, route: str | None = None):
        """The decode instance's answer to the client, as it comes, its route in ROUTE_HEADER (none:
        colocated). With `out` (a stream the
        router began itself), its lines go into it, marked as asked, and the stream ends only
        once `after` (the prefill, writing its mark or token) is done; with drop_first the first
        token's line waits for the prefill's token and loses its duplicate."""
        try:
            async with self.session.post(url + request.path, json=body, headers={ID: transfer_id}) as r:
                if out is None and not body.get("stream"):
                    data = await r.read()
                    return web.Response(body=data, status=r.status, content_type="application/json",
                                        headers=answer_headers(transfer_id, route))
                if out is None:
                    out = web.StreamResponse(status=r.status, headers={"Content-Type": r.headers.get(
                        "Content-Type", "text/event-stream"), **answer_headers(transfer_id, route)})
                    await out.prepare(request)
                    async for chunk in r.content.iter_any():
                        await out.write(chunk)
                    await out.write_eof()
                    return out
                if r.status != 200:
                    raise web.HTTPBadGateway(text=f"decode instance {url}: {r.status} {(await r.text())[:500]}")
                waiting = True  # for the decode instance's first token
                async for line in r.content:  # one SSE line at a time
                    if waiting and line.startswith(b"data: {"):
                        chunk = json.loads(line[6:])
                        choices = chunk.get("choices") or []
                        if choices and (choices[0].get("text") or choices[0].get("token_ids")):
                            waiting = False
                            if marks:
                                await out.write(b": decode-token\n\n")
                            if drop_first:
                                try:
                                    chunk = without_first_token(chunk, await after)
                                except ValueError as e:
                                    raise web.HTTPBadGateway(text=str(e)) from None
                                if chunk is None:
                                    continue
                                line = b"data: " + json.dumps(chunk).encode() + b"\n"
                    await out.write(line)
                await after  # a decode answered from its prefix cache may end before the prefill's answer
                await out.write_eof()
                return out
        except aiohttp.ClientError as e:
            raise web.HTTPBadGateway(text=f"decode instance {url}: {type(e).__name__}: {e}") from None

    async def health(self, request: web.Request) -> web.Response:
        """200 when every instance answers its /health."""
        bad = []
        for url in [*(self.prefill.urls if self.prefill else []), *self.decode.urls]:
            try:
                async with self.session.get(url + "/health", timeout=aiohttp.ClientTimeout(total=5)) as r:
                    if r.status != 200:
                        bad.append(url)
            except (aiohttp.ClientError, asyncio.TimeoutError):
                bad.append(url)
        return web.json_response({"unhealthy": bad}, status=503 if bad else 200)

    async def models(self, request: web.Request) -> web.Response:
        url = self.decode.urls[0]
        try:
            async with self.session.get(url + "/v1/models") as r:
                return web.Response(body=await r.read(), status=r.status, content_type="application/json")
        except aiohttp.ClientError as e:
            raise web.HTTPBadGateway(text=f"decode instance {url}: {type(e).__name__}: {e}") from None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.completions)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)

        async def session(app):
            # vllm serve closes a connection idle for 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE); aiohttp reuses one for
            # 15 s, and a request sent on it as the server closes it fails with "Server
            # disconnected" (seen once in 2P1D on a loaded machine): reuse idle ones for 2 s only
            self.session = aiohttp.ClientSession(timeout=self.timeout,
                                                 connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=2))
            yield
            await self.session.close()
        app.cleanup_ctx.append(session)
        return app


def argument_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m harness.serving.router", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefill", action="append", default=[], metavar="URL",
                    help="a prefill instance (repeat); none: a plain load balancer over the --decode instances")
    ap.add_argument("--decode", action="append", required=True, metavar="URL", help="a decode instance (repeat)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--policy", choices=POLICIES, default="round_robin",
                    help="how each side picks its instance (prefix_hash: by the prompt's first tokens)")
    ap.add_argument("--prefill-policy", choices=POLICIES, default=None, help="the prefill side's, if not --policy")
    ap.add_argument("--handoff", choices=HANDOFFS, default="push",
                    help="push: this project's connectors; relay: vLLM's NIXL connectors; bootstrap: vLLM's Mooncake")
    ap.add_argument("--bootstrap", action="append", default=[], metavar="URL",
                    help="a bootstrap handoff: each --prefill instance's bootstrap server, in their order")
    ap.add_argument("--decode-submit", choices=("early", "after_prefill"), default=None,
                    help="default: early for push and bootstrap, after_prefill for relay")
    ap.add_argument("--timeout-s", type=float, default=600.0,
                    help="an upstream instance that makes no progress for this long fails the request")
    ap.add_argument("--stream-prefill-token", action="store_true",
                    help="stream the prefill instance's token at once (the decode instance's duplicate is dropped)")
    ap.add_argument("--pd-policy", choices=PD_POLICIES, default="always", help="selective: a request whose prompt "
                    "is shorter than --min-prompt-tokens, or whose part the decode instance is not estimated to hold "
                    "is shorter than --min-uncached-tokens, goes to the decode instance alone (selective.py)")
    ap.add_argument("--min-prompt-tokens", type=int, default=0, metavar="N")
    ap.add_argument("--min-uncached-tokens", type=int, default=0, metavar="N")
    ap.add_argument("--corrupt", action="store_true", help="the negative control: every decode instance damages "
                    "the KV it receives, digests must fail (relay: the observer beside NIXL does)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = argument_parser().parse_args(argv)
    submit = args.decode_submit or ("after_prefill" if args.handoff == "relay" else "early")
    try:
        selective = (Selective(args.min_prompt_tokens, args.min_uncached_tokens) if args.pd_policy == "selective"
                     else None)
        router = Router(args.prefill, args.decode, args.policy, args.handoff, submit, args.timeout_s,
                        args.stream_prefill_token, args.corrupt, args.prefill_policy, args.bootstrap, selective)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    web.run_app(router.app(), host=args.host, port=args.port, print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
