# The experiment behind the soak README's memory paragraph: plain vLLM (no harness, no connector), requests
# added one by one with 8 in flight as harness/engine_process.py does. Run from the repository root:
#   .venv/bin/python results/cpu/2026-12-01-s10-soak/memory_experiment.py [logprobs] [fixed]
import os, random, sys, psutil
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
from vllm import LLM, SamplingParams
lp = 1 if "logprobs" in sys.argv else None
llm = LLM(model="models/tiny-llama", dtype="float32", block_size=32, max_model_len=2048,
          kv_cache_memory_bytes=2**30, enforce_eager=True, enable_prefix_caching=True, disable_log_stats=True)
engine = llm.llm_engine
rng = random.Random(0)
p = psutil.Process()
out, done, sent, inflight = [], 0, 0, 0
while done < 800:
    while inflight < 8 and sent < 800:
        n = 750 if "fixed" in sys.argv else rng.randrange(1, 1501)
        engine.add_request(f"r-{sent}", {"prompt_token_ids": [rng.randrange(10, 3400) for _ in range(n)]},
                           SamplingParams(max_tokens=16, ignore_eos=True, detokenize=False, logprobs=lp))
        sent += 1; inflight += 1
    for o in engine.step():
        if o.finished:
            done += 1; inflight -= 1
            if done % 100 == 0:
                m = p.memory_info(); out.append(round((m.rss - m.shared) / 2**20))
print(sys.argv[1:], "step loop, private MiB after each 100:", out, flush=True)
