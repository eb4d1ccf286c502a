"""The experiment behind the soak README's memory paragraph: plain vLLM (no harness, no
connector), requests added one by one with 8 in flight as harness/engine_process.py does, prefix
caching on; prints the process's private memory (RSS less shared pages) after each 100 requests.
Run from the repository root:

    .venv/bin/python results/cpu/2026-12-01-s10-soak/memory_experiment.py [logprobs] [fixed]

logprobs: ask for one log-probability per token, as the harness does; fixed: every prompt 750
tokens instead of lengths uniform in 1-1,500."""

import os
import random
import sys

import psutil

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # noqa: E402 - before vLLM is imported
from vllm import LLM, SamplingParams  # noqa: E402

logprobs = 1 if "logprobs" in sys.argv else None
llm = LLM(model="models/tiny-llama", dtype="float32", block_size=32, max_model_len=2048,
          kv_cache_memory_bytes=2**30, enforce_eager=True, enable_prefix_caching=True, disable_log_stats=True)
engine = llm.llm_engine
rng = random.Random(0)
me = psutil.Process()
private, done, sent, in_flight = [], 0, 0, 0
while done < 800:
    while in_flight < 8 and sent < 800:
        n = 750 if "fixed" in sys.argv else rng.randrange(1, 1501)
        engine.add_request(f"r-{sent}", {"prompt_token_ids": [rng.randrange(10, 3400) for _ in range(n)]},
                           SamplingParams(max_tokens=16, ignore_eos=True, detokenize=False, logprobs=logprobs))
        sent += 1
        in_flight += 1
    for out in engine.step():
        if out.finished:
            done += 1
            in_flight -= 1
            if done % 100 == 0:
                m = me.memory_info()
                private.append(round((m.rss - m.shared) / 2**20))
print(sys.argv[1:], "private MiB after each 100 requests:", private, flush=True)
