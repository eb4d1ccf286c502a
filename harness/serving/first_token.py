"""--stream-prefill-token (harness/serving/router.py): the prefill instance's token is the first
chunk of the client's stream, and the decode instance's duplicate of it is dropped."""

from __future__ import annotations

import json


def sse(data: dict) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def prefill_token_chunk(answer: dict) -> dict:
    """The prefill instance's (whole) answer as the first chunk of a stream."""
    choice = {**answer["choices"][0], "index": 0, "finish_reason": None, "stop_reason": None}
    return {"id": answer.get("id"), "object": "text_completion", "created": answer.get("created"),
            "model": answer.get("model"), "choices": [choice]}


def without_first_token(chunk: dict, answer: dict) -> dict | None:
    """The decode instance's first chunk with tokens, minus the token the prefill's answer has
    already given the client; None when nothing is left to send. Raises ValueError when the
    two tokens differ."""
    c, p = chunk["choices"][0], answer["choices"][0]
    ids, p_ids = c.get("token_ids"), p.get("token_ids")
    if ids and p_ids and ids[0] != p_ids[0] or not (ids and p_ids) and not c.get("text", "").startswith(p["text"]):
        raise ValueError(f"the decode instance's first token ({ids[:1] if ids else c.get('text')!r}) differs from "
                         f"the prefill instance's ({p_ids[:1] if p_ids else p['text']!r})")
    if ids:
        c["token_ids"] = ids[1:]
    c["text"] = c.get("text", "")[len(p["text"]):]
    if c.get("logprobs"):
        c["logprobs"] = {k: (v[1:] if isinstance(v, list) else v) for k, v in c["logprobs"].items()}
    c.pop("prompt_token_ids", None)  # the prefill's chunk carried them
    if not c["text"] and not c.get("token_ids") and c.get("finish_reason") is None and not chunk.get("usage"):
        return None
    return chunk
