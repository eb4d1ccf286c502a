"""Workloads: the prompts a run sends, as token ids, checked before any engine starts.

Each builder is the `_target_` of a `conf/workload/*.yaml` file and returns a `Workload`;
`build_workload` calls it.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig


class WorkloadError(ValueError):
    pass


@dataclass
class Prompt:
    index: int
    token_ids: list[int]
    text: str | None = None
    # multi-turn (Conversations): the conversation and its turn (from 0), and the prompt (its
    # previous turn) that must have finished before this one is sent; None elsewhere
    conversation: int | None = None
    turn: int | None = None
    follows: int | None = None
    # workload=corpus: the text's own continuation of the prompt (harness/records/accuracy.py task_score)
    reference: list[int] | None = None
    # workload=trace: when the trace sent it (s from its first request) and its output length
    arrival_s: float | None = None
    max_tokens: int | None = None


@dataclass
class Workload:
    name: str
    prompts: list[Prompt]
    concurrency: int = 1  # requests in flight at once

    def check_fits(self, max_model_len: int, max_tokens: int) -> None:
        if not self.prompts:
            raise WorkloadError(f"workload {self.name!r} has no prompts")
        if self.concurrency < 1:
            raise WorkloadError(f"workload.concurrency must be >= 1, got {self.concurrency}")
        for p in self.prompts:
            if not p.token_ids:
                raise WorkloadError(f"prompt {p.index} of workload {self.name!r} is empty")
            out = p.max_tokens or max_tokens
            if len(p.token_ids) + out > max_model_len:
                limit = (f"its output length {out}" if p.max_tokens else f"sampling.max_tokens={max_tokens}")
                raise WorkloadError(
                    f"prompt {p.index} of workload {self.name!r} has {len(p.token_ids)} tokens; with "
                    f"{limit} it needs engine.max_model_len >= "
                    f"{len(p.token_ids) + out} (now {max_model_len}). Raise engine.max_model_len "
                    f"(within the model's context) or shorten the prompt.")

    def check_min_prompt_len(self, min_len: int, needed_by: str, why: str) -> None:
        for p in self.prompts:
            if self.prompt_len(p) < min_len:
                raise WorkloadError(f"prompt {p.index} of workload {self.name!r} has {self.prompt_len(p)} tokens; "
                                    f"{needed_by} needs at least {min_len} ({why})")

    def prompt_len(self, p: Prompt) -> int:
        return len(p.token_ids)

    def answered(self, p: Prompt, answer: list[int]) -> None:
        """The reference answer (the baseline's) to prompt p: builds the prompts that continue it
        (multi-turn); nothing for workloads whose prompts are all known in advance."""


@dataclass
class Conversations(Workload):
    """Multi-turn: turn t + 1's prompt is turn t's prompt, turn t's answer and new user text, so
    it is built (answered) once turn t has its reference answer; until then its token_ids are
    empty. Every turn's length is known in advance: each answer is answer_len tokens (greedy, EOS
    ignored, sampling.max_tokens)."""

    user_ids: dict[int, list[int]] = field(default_factory=dict)  # prompt index -> the turn's new user text
    answer_len: int = 16

    def prompt_len(self, p: Prompt) -> int:
        if p.follows is None:
            return len(self.user_ids[p.index])
        return self.prompt_len(self.prompts[p.follows]) + self.answer_len + len(self.user_ids[p.index])

    def check_fits(self, max_model_len: int, max_tokens: int) -> None:
        if self.answer_len != max_tokens:
            raise WorkloadError(f"workload.answer_len={self.answer_len} but sampling.max_tokens={max_tokens}: each "
                                f"turn's answer is the model's whole output; set sampling.max_tokens (answer_len "
                                f"follows it)")
        if self.concurrency < 1:
            raise WorkloadError(f"workload.concurrency must be >= 1, got {self.concurrency}")
        last = max(self.prompts, key=self.prompt_len)
        if self.prompt_len(last) + max_tokens > max_model_len:
            raise WorkloadError(
                f"conversation {last.conversation} of workload {self.name!r} reaches {self.prompt_len(last)} prompt "
                f"tokens at turn {last.turn + 1}; with its answer of {max_tokens} it needs engine.max_model_len >= "
                f"{self.prompt_len(last) + max_tokens} (now {max_model_len}). Raise engine.max_model_len or lower "
                f"workload.turns, workload.first_user_len, workload.user_len or sampling.max_tokens.")

    def answered(self, p: Prompt, answer: list[int]) -> None:
        for q in self.prompts:
            if q.follows == p.index and not q.token_ids:  # built once: later passes send the same ids
                q.token_ids = p.token_ids + list(answer) + self.user_ids[q.index]


def build_workload(cfg: DictConfig, tokenizer) -> Workload:
    """The workload `cfg` (a `conf/workload/*.yaml`) names, built by its `_target_`. Hydra wraps
    whatever a target raises in its own exception: a builder's WorkloadError is unwrapped here,
    so that bad input stays one line."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    try:
        return instantiate(cfg, tokenizer=tokenizer)
    except InstantiationException as e:
        if isinstance(e.__cause__, WorkloadError):
            raise e.__cause__ from None
        raise


def text_prompts(name: str, prompts: list[str], tokenizer, concurrency: int = 1,
                 prompt_len: int | None = None) -> Workload:
    """Fixed texts; with prompt_len, each text's tokens are repeated or cut to exactly that length."""
    out = []
    for i, text in enumerate(prompts):
        ids = tokenizer(text).input_ids
        if prompt_len is not None:
            if prompt_len < 1:
                raise WorkloadError(f"workload.prompt_len must be >= 1, got {prompt_len}")
            ids = (ids * (prompt_len // max(len(ids), 1) + 1))[:prompt_len]
        out.append(Prompt(i, ids, text))
    return Workload(name, out, concurrency)


def synthetic(name: str, prompt_len: int, num_prompts: int, tokenizer, seed: int = 0,
              concurrency: int = 1) -> Workload:
    """Random token ids of one length (as vLLM's own benchmarks use), seeded."""
    if prompt_len < 1 or num_prompts < 1:
        raise WorkloadError(f"workload.prompt_len and workload.num_prompts must be >= 1, got "
                            f"{prompt_len} and {num_prompts}")
    vocab = synthetic_vocab(tokenizer)
    rng = random.Random(seed)
    return Workload(name, [Prompt(i, [rng.choice(vocab) for _ in range(prompt_len)]) for i in range(num_prompts)],
                    concurrency)


def corpus(name: str, path: str, prompt_len: int, num_prompts: int, reference_len: int, tokenizer, seed: int = 0,
           concurrency: int = 1) -> Workload:
    """Prompts cut from a text at seeded offsets (by default the corpus the project's models were
    trained on, which they have memorised), each `<s>` and prompt_len - 1 of its tokens (as the
    models saw training windows), with the text's next reference_len tokens as its reference: a
    run's task score is the share of output tokens equal to them (harness/records/accuracy.py), and the
    baseline's score is the ceiling a P/D path can reach."""
    file = Path(path)
    if not file.is_file():
        raise WorkloadError(f"workload file {path!r} not found: set workload.path to a text file")
    if prompt_len < 2 or num_prompts < 1 or reference_len < 1:
        raise WorkloadError(f"workload.prompt_len must be >= 2 and workload.num_prompts and workload.reference_len "
                            f">= 1, got {prompt_len}, {num_prompts} and {reference_len}")
    ids = tokenizer(file.read_text(), verbose=False).input_ids  # longer than the model's context: known, cut below
    bos = tokenizer.bos_token_id
    body = ids[1:] if bos is not None and ids[:1] == [bos] else ids
    head = [bos] if bos is not None else []
    take = prompt_len - len(head)
    if len(body) < take + reference_len:
        raise WorkloadError(f"{path} has {len(body)} tokens: too few for prompts of {prompt_len} and references of "
                            f"{reference_len}")
    rng = random.Random(seed)
    prompts = []
    for i in range(num_prompts):
        at = rng.randrange(len(body) - take - reference_len + 1)
        prompts.append(Prompt(i, head + body[at:at + take], reference=body[at + take:at + take + reference_len]))
    return Workload(name, prompts, concurrency)


ANY_VOCAB = (10, 3400)  # token ids inside every model's vocabulary, none of them special: randrange(*ANY_VOCAB)


def bench_prompts(lengths: list[int], per_length: int, seed: int = 0) -> str:
    """scripts/bench_strategies.py's prompts file (for workload=jsonl): per_length prompts of each
    length in turn, random token ids in [10, 3400) (inside every model's vocabulary), seeded. The
    same lengths and count give the same file byte for byte, so a committed benchmark keeps
    bench.lengths and bench.per_length (its meta.json) instead of the file
    (scripts/slim_results.py --prompts DIR writes it again)."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(*ANY_VOCAB) for _ in range(n)] for n in lengths for _ in range(per_length)]
    return "".join(json.dumps({"prompt": p}) + "\n" for p in prompts)


def synthetic_vocab(tokenizer) -> list[int]:
    """The token ids random prompts are drawn from: the vocabulary less its special tokens."""
    special = set(tokenizer.all_special_ids)
    return [t for t in range(len(tokenizer)) if t not in special]


def multiturn(name: str, num_conversations: int, turns: int, first_user_len: int, user_len: int, answer_len: int,
              block_size: int, tokenizer, seed: int = 0, concurrency: int = 1) -> Conversations:
    """num_conversations conversations of `turns` turns, user text of seeded random token ids (as
    synthetic's). Turn t's new user text is first_user_len (t = 0) or user_len tokens, lengthened
    so that the prompts of turns 2, 4, ... (counted from 1) end exactly on a KV block boundary
    (prompt_len % block_size == 0: up to block_size - 1 tokens added) and those of turns 1, 3, ...
    end inside a block (one token added where they would not): the decode engine's prefix cache
    then holds the previous turn up to a block's end, or up to a block's middle."""
    if turns < 1 or num_conversations < 1:
        raise WorkloadError(f"workload.turns and workload.num_conversations must be >= 1, got {turns} and "
                            f"{num_conversations}")
    if first_user_len < 1 or user_len < 0:
        raise WorkloadError(f"workload.first_user_len must be >= 1 and workload.user_len >= 0, got "
                            f"{first_user_len} and {user_len}")
    vocab = synthetic_vocab(tokenizer)
    rng = random.Random(seed)
    prompts, user_ids = [], {}
    for c in range(num_conversations):
        prompt_len = 0
        for t in range(turns):
            before = prompt_len + answer_len if t else 0  # the previous prompt and its answer
            n = first_user_len if t == 0 else user_len
            if t % 2:
                n += -(before + n) % block_size
            elif (before + n) % block_size == 0:
                n += 1
            prompt_len = before + n
            i = len(prompts)
            user_ids[i] = [rng.choice(vocab) for _ in range(n)]
            prompts.append(Prompt(i, list(user_ids[i]) if t == 0 else [], conversation=c, turn=t,
                                  follows=None if t == 0 else i - 1))
    return Conversations(name, prompts, concurrency, user_ids=user_ids, answer_len=answer_len)


def trace(name: str, path: str, tokenizer, block_tokens: int = 512, time_scale: float = 1.0,
          max_requests: int | None = None, seed: int = 0, concurrency: int = 1) -> Workload:
    """A timestamped request trace in the Mooncake format, replayed by runner=serve: one JSON object
    a line with `timestamp` (ms), `input_length`, `output_length` and `hash_ids`, each hash id one
    block of `block_tokens` tokens that every request naming it shares (a prefix served before).
    A hash id's block is seeded random token ids (the same id, the same tokens), the prompt its
    blocks in order cut to input_length (any tokens past the blocks its own); it arrives at its
    timestamp times time_scale (0.5: twice as fast) and asks for output_length tokens."""
    file = Path(path)
    if not file.is_file():
        raise WorkloadError(f"workload.path={path!r}: no such trace file")
    if block_tokens < 1 or not time_scale > 0:
        raise WorkloadError(f"workload.block_tokens must be >= 1 and workload.time_scale > 0, got {block_tokens} "
                            f"and {time_scale}")
    vocab = synthetic_vocab(tokenizer)

    def block(key: str) -> list[int]:
        rng = random.Random(f"{seed}-{key}")
        return [rng.choice(vocab) for _ in range(block_tokens)]

    blocks: dict[int, list[int]] = {}
    lines = [line for line in file.read_text().splitlines() if line.strip()][:max_requests]
    prompts, start = [], None
    for n, line in enumerate(lines, 1):
        try:
            r = json.loads(line)
            t, n_in, n_out, ids = (float(r["timestamp"]), int(r["input_length"]), int(r["output_length"]),
                                   [int(h) for h in r.get("hash_ids", [])])
        except (ValueError, KeyError, TypeError) as e:
            raise WorkloadError(f"{path} line {n}: not a trace request (timestamp, input_length, output_length, "
                                f"hash_ids): {e}") from None
        if n_in < 1 or n_out < 1:
            raise WorkloadError(f"{path} line {n}: input_length and output_length must be >= 1")
        start = t if start is None else start
        if t < start:
            raise WorkloadError(f"{path} line {n}: timestamps must not go back ({t} after {start})")
        tokens = [tok for h in ids for tok in blocks.setdefault(h, block(str(h)))]
        k = 0
        while len(tokens) < n_in:  # past the hash ids: this request's own
            tokens += block(f"request-{n}-{k}")
            k += 1
        prompts.append(Prompt(n - 1, tokens[:n_in], arrival_s=(t - start) / 1e3 * time_scale, max_tokens=n_out))
    if not prompts:
        raise WorkloadError(f"{path}: no requests")
    return Workload(name, prompts, concurrency)


def jsonl(name: str, path: str, tokenizer, field: str = "prompt", concurrency: int = 1) -> Workload:
    """One JSON object per line; `field` holds the prompt text (or a list of token ids)."""
    file = Path(path)
    if not file.is_file():
        raise WorkloadError(f"workload file {path!r} not found: set workload.path to a JSONL file")
    prompts = []
    for n, line in enumerate(file.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)[field]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise WorkloadError(f"{path}:{n}: expected a JSON object with a {field!r} field ({e})") from None
        if isinstance(value, list):
            if not all(isinstance(t, int) and 0 <= t < len(tokenizer) for t in value):
                raise WorkloadError(f"{path}:{n}: {field!r} holds a list, so it must be token ids of the model's "
                                    f"vocabulary (integers 0..{len(tokenizer) - 1})")
            prompts.append(Prompt(len(prompts), value))
        else:
            prompts.append(Prompt(len(prompts), tokenizer(str(value)).input_ids, str(value)))
    return Workload(name, prompts, concurrency)


def warmup_lengths(workload: Workload) -> list[int]:
    """The prompt lengths a warm-up takes: the longest of each power-of-two range the workload's
    lengths fall in, longest first. Kernels are picked and compiled by shape (Triton's codecs
    specialize on the block count, cuBLAS and attention pick by token count): one length only
    (the longest, before 2026-12-06) left the first measured request of each other length to pay
    that (309-333 ms in fused_int8's decode side on an H100)."""
    by_range: dict[int, int] = {}
    for p in workload.prompts:
        n = workload.prompt_len(p)
        by_range[(n - 1).bit_length()] = max(n, by_range.get((n - 1).bit_length(), 0))
    return sorted(by_range.values(), reverse=True)


def warmup_workload(workload: Workload, n: int, batch: int | None = None) -> Workload:
    """The warm-up's prompts: n rounds, each a prompt of every warmup_lengths length and at least a
    full batch (batch, else the workload's concurrency: a cold engine's first batch of 4 cost
    about 360 ms on an H100), sent as many at once as the workload sends. Their tokens are the
    longest prompt's reversed, then rotated, so that no measured prompt finds them in a prefix
    cache. Negative indices keep their transfer ids apart from the measured ones (is_warmup)."""
    tokens = max(workload.prompts, key=lambda p: len(p.token_ids)).token_ids[::-1]
    # a conversation's later turns are built as the baseline answers them, after runner=serve's
    # warm-up: their known length, in the tokens there are
    lengths = warmup_lengths(workload)
    tokens = (tokens * -(-lengths[0] // len(tokens)))[:lengths[0]]
    count = n * max(len(lengths), batch or workload.concurrency)
    return Workload("warm-up", [Prompt(-1 - i, (tokens[i:] + tokens[:i])[:lengths[i % len(lengths)]])
                                for i in range(count)], concurrency=workload.concurrency)


def is_warmup(transfer_id: str) -> bool:
    """Whether a transfer record's id (<run tag>-<prompt index>) is a warm-up prompt's (index < 0)."""
    return transfer_id.rpartition("-")[0].endswith("-")
