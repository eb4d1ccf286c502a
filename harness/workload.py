"""Workloads: the prompts a run sends, as token ids, checked before any engine starts.

Each builder is the `_target_` of a `conf/workload/*.yaml` file and returns a `Workload`;
`build_workload` calls it.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig


class WorkloadError(ValueError):
    pass


@dataclass
class Prompt:
    index: int
    token_ids: list[int]
    text: str | None = None


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
            if len(p.token_ids) + max_tokens > max_model_len:
                raise WorkloadError(
                    f"prompt {p.index} of workload {self.name!r} has {len(p.token_ids)} tokens; with "
                    f"sampling.max_tokens={max_tokens} it needs engine.max_model_len >= "
                    f"{len(p.token_ids) + max_tokens} (now {max_model_len}). Raise engine.max_model_len "
                    f"(within the model's context) or shorten the prompt.")

    def check_min_prompt_len(self, min_len: int, needed_by: str, why: str) -> None:
        for p in self.prompts:
            if len(p.token_ids) < min_len:
                raise WorkloadError(f"prompt {p.index} of workload {self.name!r} has {len(p.token_ids)} tokens; "
                                    f"{needed_by} needs at least {min_len} ({why})")


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
    special = set(tokenizer.all_special_ids)
    vocab = [t for t in range(len(tokenizer)) if t not in special]
    rng = random.Random(seed)
    return Workload(name, [Prompt(i, [rng.choice(vocab) for _ in range(prompt_len)]) for i in range(num_prompts)],
                    concurrency)


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
