"""The instances of one side of the router (harness/serving/router.py), and how it picks one for
a request: round robin, fewest outstanding requests, or the prompt's first tokens."""

from __future__ import annotations

import hashlib
import itertools
import json

POLICIES = ("round_robin", "least_outstanding", "prefix_hash")
PREFIX_TOKENS = 64  # prefix_hash: a prompt's first tokens (4 blocks of vLLM's default 16) pick its instance


def prefix_key(body: dict, tokens: int = PREFIX_TOKENS) -> bytes:
    """What identifies a request's prefix: its prompt's first token ids, or (a text prompt, chat
    messages) the first 4 characters a token of its text."""
    prompt = body.get("prompt", body.get("messages"))
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return json.dumps(prompt[:tokens]).encode()
    text = prompt if isinstance(prompt, str) else json.dumps(prompt)
    return text[:4 * tokens].encode()


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

    def pick(self, body: dict | None = None) -> str:
        """The instance for the next request (body: the request's, for prefix_hash), counted
        outstanding from now (requests sent together see each other); `done` when its answer is over."""
        if self.policy == "round_robin":
            url = next(self._turn)
        elif self.policy == "prefix_hash":
            # rendezvous hashing: the instance whose hash with the prompt's first tokens is highest,
            # so prompts that share them meet their prefix cache there, and an instance added or
            # removed moves only the prefixes it wins or held
            key = prefix_key(body or {})
            url = max(self.urls, key=lambda u: hashlib.blake2b(u.encode() + b"\0" + key, digest_size=8).digest())
        else:
            url = min(self.urls, key=lambda u: self.outstanding[u])  # ties: the first listed
        self.outstanding[url] += 1
        return url

    def done(self, url: str) -> None:
        self.outstanding[url] -= 1
