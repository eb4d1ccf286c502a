"""A small async HTTP router in front of prefill and decode `vllm serve` instances (issue 13):
the kind a user deploys to try disaggregated serving, usable on its own.

    python -m harness.router --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200 --port 8000

Each completion request goes to a prefill instance with max_tokens=1 and to a decode instance,
whose answer (streamed or whole) goes back to the client. How the KV gets from one to the other
is the connectors' business; the router only carries what ties the two requests together:
- push (this project's strategies): both requests carry one transfer id in kv_transfer_params.
  `early` submission (the default) sends both at once and the decode instance parks its request
  until the KV is in; `after_prefill` sends the decode request when the prefill answered.
- pull (vLLM's NixlConnector): the prefill request asks the instance to keep the KV for a remote
  decode (do_remote_decode); its answer's kv_transfer_params go with the decode request.
With several instances per side it picks by round robin or by fewest outstanding requests.
Without prefill instances it is a plain load balancer over the others (colocated instances
behind the same proxy, so that a comparison with P/D pays the same hop).
A client's X-Request-Id header becomes the transfer id (the connectors' records carry it), and
the answer says which one it was in X-Transfer-Id. If the client goes away, the upstream
requests are closed, which aborts them in vLLM.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import uuid

import aiohttp
from aiohttp import web

POLICIES = ("round_robin", "least_outstanding")


class Pool:
    """The instances of one side, and how many requests each has in flight through this router."""

    def __init__(self, urls: list[str], policy: str):
        if not urls:
            raise ValueError("a pool needs at least one instance URL")
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}: one of {', '.join(POLICIES)}")
        self.urls = [u.rstrip("/") for u in urls]
        self.policy = policy
        self.outstanding = dict.fromkeys(self.urls, 0)
        self._turn = itertools.cycle(self.urls)

    def pick(self) -> str:
        if self.policy == "round_robin":
            return next(self._turn)
        return min(self.urls, key=lambda u: self.outstanding[u])  # ties: the first listed


class Router:
    def __init__(self, prefill: list[str], decode: list[str], policy: str = "round_robin", handoff: str = "push",
                 decode_submit: str = "early", timeout_s: float = 600.0):
        if handoff not in ("push", "pull"):
            raise ValueError(f"unknown handoff {handoff!r}: push or pull")
        if decode_submit not in ("early", "after_prefill"):
            raise ValueError(f"unknown decode_submit {decode_submit!r}: early or after_prefill")
        if handoff == "pull" and decode_submit == "early":
            raise ValueError("a pull handoff needs the prefill's answer first: decode_submit=after_prefill")
        self.prefill = Pool(prefill, policy) if prefill else None
        self.decode = Pool(decode, policy)
        self.handoff, self.decode_submit = handoff, decode_submit
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.session: aiohttp.ClientSession | None = None

    # ------------------------------------------------------------ the two requests
    def prefill_body(self, body: dict, transfer_id: str) -> dict:
        params = {"do_remote_decode": True} if self.handoff == "pull" else {"transfer_id": transfer_id}
        out = {**body, "max_tokens": 1, "stream": False, "kv_transfer_params": params}
        out.pop("stream_options", None)
        out.pop("max_completion_tokens", None)
        return out

    def decode_body(self, body: dict, transfer_id: str, prefill_answer: dict | None) -> dict:
        if self.handoff == "pull":
            params = (prefill_answer or {}).get("kv_transfer_params")
            if not params:
                raise web.HTTPBadGateway(text="the prefill instance returned no kv_transfer_params")
        else:
            params = {"transfer_id": transfer_id}
            if self.decode_submit == "early":
                params["load"] = "async"
        return {**body, "kv_transfer_params": params}

    async def _prefill(self, url: str, path: str, body: dict) -> dict:
        self.prefill.outstanding[url] += 1
        try:
            async with self.session.post(url + path, json=body) as r:
                answer = await r.json(content_type=None)
                if r.status != 200:
                    raise web.HTTPBadGateway(text=f"prefill instance {url}: {r.status} {json.dumps(answer)[:500]}")
                return answer
        finally:
            self.prefill.outstanding[url] -= 1

    # ------------------------------------------------------------ HTTP
    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        transfer_id = request.headers.get("X-Request-Id") or f"router-{uuid.uuid4().hex}"
        d_url = self.decode.pick()
        if self.prefill is None:  # colocated: one instance does both
            return await self._relay_decode(request, d_url, body, transfer_id)
        p_url = self.prefill.pick()
        prefill = asyncio.ensure_future(self._prefill(p_url, request.path, self.prefill_body(body, transfer_id)))
        try:
            answer = None
            if self.decode_submit == "after_prefill":
                answer = await prefill
            decode = asyncio.ensure_future(self._relay_decode(
                request, d_url, self.decode_body(body, transfer_id, answer), transfer_id))
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
        finally:
            if not prefill.done():  # the client went away, or the decode side failed: abort upstream
                prefill.cancel()

    async def _relay_decode(self, request: web.Request, url: str, body: dict, transfer_id: str):
        self.decode.outstanding[url] += 1
        try:
            async with self.session.post(url + request.path, json=body) as r:
                if not body.get("stream"):
                    data = await r.read()
                    return web.Response(body=data, status=r.status, content_type="application/json",
                                        headers={"X-Transfer-Id": transfer_id})
                out = web.StreamResponse(status=r.status, headers={"Content-Type": r.headers.get(
                    "Content-Type", "text/event-stream"), "X-Transfer-Id": transfer_id})
                await out.prepare(request)
                async for chunk in r.content.iter_any():
                    await out.write(chunk)
                await out.write_eof()
                return out
        finally:
            self.decode.outstanding[url] -= 1

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
        async with self.session.get(self.decode.urls[0] + "/v1/models") as r:
            return web.Response(body=await r.read(), status=r.status, content_type="application/json")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.completions)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)

        async def session(app):
            self.session = aiohttp.ClientSession(timeout=self.timeout,
                                                 connector=aiohttp.TCPConnector(limit=0, force_close=False))
            yield
            await self.session.close()
        app.cleanup_ctx.append(session)
        return app


def argument_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m harness.router", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefill", action="append", default=[], metavar="URL",
                    help="a prefill instance (repeat); none: a plain load balancer over the --decode instances")
    ap.add_argument("--decode", action="append", required=True, metavar="URL", help="a decode instance (repeat)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--policy", choices=POLICIES, default="round_robin")
    ap.add_argument("--handoff", choices=("push", "pull"), default="push",
                    help="push: this project's connectors; pull: vLLM's NixlConnector")
    ap.add_argument("--decode-submit", choices=("early", "after_prefill"), default=None,
                    help="default: early for push, after_prefill for pull")
    ap.add_argument("--timeout-s", type=float, default=600.0, help="per upstream request")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = argument_parser().parse_args(argv)
    submit = args.decode_submit or ("early" if args.handoff == "push" else "after_prefill")
    try:
        router = Router(args.prefill, args.decode, args.policy, args.handoff, submit, args.timeout_s)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    web.run_app(router.app(), host=args.host, port=args.port, print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
