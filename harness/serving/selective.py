"""serve.pd_policy=selective (the router's --pd-policy selective): disaggregate a request only where
it pays, as llm-d's P/D decider does. A short prompt, or one whose decode instance already holds
most of it in its prefix cache, costs the decode instance little to compute itself, and a prefill
round trip plus a transfer would only add to its TTFT: such a request goes to the decode instance
alone, with no kv_transfer_params (route `decode_only`); the rest go through prefill and decode
(route `disagg`). The router says which in the answer's X-PD-Route header, so that the harness's
rows and checks know which requests should have moved KV.

What a decode instance holds is estimated from what this router sent it (PrefixTable): the full
blocks of every prompt routed there, hashed as a chain as vLLM's prefix cache keys them, oldest
dropped first once the table holds as many blocks as the instance's KV cache. The block size, the
cache's size and whether prefix caching is on are read once from the instance's /metrics
(vllm:cache_config_info). The estimate misses what others sent the instance and what its cache
evicted early, and counts only prompts (a conversation's answers are cached by vLLM too): it is the
router's guess, and the rows' decode_hit_tokens say what the instance really had.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from harness.records.schema import DECODE_ONLY, DISAGG

PD_POLICIES = ("always", "selective")
ROUTE_HEADER = "X-PD-Route"


class PrefixTable:
    """The prompt blocks a router has sent to one decode instance, least recently used first."""

    def __init__(self, block_size: int, capacity_blocks: int | None):
        """capacity_blocks: at most this many blocks are kept (None: no limit; 0: nothing is cached)."""
        self.block_size, self.capacity = block_size, capacity_blocks
        self.blocks: OrderedDict[bytes, None] = OrderedDict()

    def hashes(self, token_ids: list[int]) -> list[bytes]:
        """Each full block's hash, chained over the blocks before it (a block is cached only
        after the same ones)."""
        out, parent = [], b""
        for start in range(0, len(token_ids) - self.block_size + 1, self.block_size):
            block = token_ids[start:start + self.block_size]
            parent = hashlib.blake2b(parent + repr(block).encode(), digest_size=16).digest()
            out.append(parent)
        return out

    def cached_tokens(self, token_ids: list[int]) -> int:
        """The prompt's leading tokens held here, in whole blocks."""
        n = 0
        for h in self.hashes(token_ids):
            if h not in self.blocks:
                break
            n += 1
        return n * self.block_size

    def add(self, token_ids: list[int]) -> None:
        if self.capacity == 0:
            return
        for h in self.hashes(token_ids):
            self.blocks[h] = None
            self.blocks.move_to_end(h)
        while self.capacity is not None and len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)


async def cache_config(session: aiohttp.ClientSession, url: str) -> dict[str, str]:
    """The instance's vLLM cache configuration (block_size, num_gpu_blocks, enable_prefix_caching,
    ...) from its /metrics; empty where it exports none."""
    async with session.get(url + "/metrics") as r:
        text = await r.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("vllm:cache_config_info"):
                return dict(sample.labels)
    return {}


@dataclass
class Selective:
    """The decision per request: decode only when the prompt has fewer than min_prompt_tokens
    tokens, or fewer than min_uncached_tokens beyond what the chosen decode instance is estimated
    to hold."""

    min_prompt_tokens: int
    min_uncached_tokens: int
    tables: dict[str, PrefixTable] = field(default_factory=dict)

    def __post_init__(self):
        for name in ("min_prompt_tokens", "min_uncached_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {v!r}")

    async def table(self, session: aiohttp.ClientSession, url: str) -> PrefixTable:
        if url not in self.tables:
            info = await cache_config(session, url)
            blocks = info.get("num_gpu_blocks")
            capacity = int(blocks) if blocks not in (None, "None") else None
            if info.get("enable_prefix_caching") == "False":
                capacity = 0
            self.tables[url] = PrefixTable(int(info.get("block_size") or 16), capacity)
        return self.tables[url]

    async def route(self, session: aiohttp.ClientSession, url: str, body: dict) -> str:
        """DISAGG or DECODE_ONLY for this request to decode instance `url`; its prompt's blocks are
        then counted as held there."""
        ids = await prompt_token_ids(session, url, body)
        table = await self.table(session, url)
        uncached = len(ids) - table.cached_tokens(ids)
        table.add(ids)
        return DECODE_ONLY if len(ids) < self.min_prompt_tokens or uncached < self.min_uncached_tokens else DISAGG


async def prompt_token_ids(session: aiohttp.ClientSession, url: str, body: dict) -> list[int]:
    """The request's prompt as token ids: as sent, or (text, chat messages) as the instance's
    /tokenize makes them."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return prompt
    ask = {"model": body.get("model"), **({"messages": body["messages"]} if "messages" in body else {"prompt": prompt})}
    async with session.post(url + "/tokenize", json=ask) as r:
        answer = await r.json(content_type=None)
        if r.status != 200 or "tokens" not in answer:
            raise aiohttp.ClientResponseError(r.request_info, r.history, status=r.status,
                                              message=f"/tokenize: {str(answer)[:200]}")
        return answer["tokens"]
