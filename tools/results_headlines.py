"""The headline figures results/INDEX.md lists first (tools/results_index.py renders and checks
them): each names its run directory (relative to results/) and the document that quotes it, with
the quoted text, so that writing the index fails when either is gone. Kept by hand: add a line
when a README starts quoting a figure, change it when the figure is measured again."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Headline:
    what: str
    figure: str
    run: str  # relative to results/
    source: str  # the document that quotes it, relative to the project root
    quote: str  # text the source holds (whitespace aside)


HEADLINES = [
    Headline("GPU, fused: TTFT overhead at 8k tokens, one H200, the current code", "+13.6 ms [9.0, 17.6]; "
             "transfer 0.511 ms", "gpu/2026-12-04-s23/ttft", "README.md", "fused at 8k +13.6 ms\n[9.0, 17.6]"),
    Headline("GPU, lossy strategies at 8k tokens (8B shape): TTFT overhead with the harness's checks on, int4's "
             "byte-addressed kernel", "fused_int8 +10.3 ms [5.5, 13.7], fused_int4 +11.0 [8.7, 15.4] (fused +6.1); "
             "transfer 0.412 and 0.477 ms (fused 0.513)", "gpu/2026-12-05-s29/ttft", "README.md",
             "| fused_int4 | 0.477 | 4.91 | +11.0 ms [8.7, 15.4] |"),
    Headline("GPU, serving 1P1D on one H200: layerwise's handover overhead (llama3_8b_kv, 2k tokens)",
             "+19.4 ms at 2 req/s, +22.7 at 8 req/s", "gpu/2026-12-05-s29/serve1", "README.md",
             "| layerwise, 2 req/s | 46.6 [43.1, 51.2] | 27.0 [24.8, 29.6] |"),
    Headline("GPU, transport=nixl against staged on one H200 (fused at 8k)", "KV e2e 3.05 against 2.14 ms; TTFT "
             "overhead +14.3 [4.7, 17.2] against +9.9 [0.4, 15.3]", "gpu/2026-12-05-s29/transport", "README.md",
             "+14.3 ms\n[4.7, 17.2] against +9.9 [0.4, 15.3]"),
    Headline("GPU, fused_fp8 at 8k tokens (8B shape): TTFT overhead with the harness's checks on, the FP8 check "
             "kernel fixed", "+14.0 ms [12.4, 17.9] (fused +13.8 in that run)", "gpu/2026-12-05-s27/ttft", "README.md",
             "| fused_fp8 (s27) | 0.393 | 6.68 | +14.0 ms [12.4, 17.9] |"),
    Headline("GPU, lossy strategies' accuracy (llama3_8b_kv, 512 tokens): match rate", "fused 1.0, fused_int8 0.938, "
             "fused_fp8 0.75, fused_int4 0.625", "gpu/2026-12-04-s23/lossy512/a", "README.md",
             "| fused_int8 | 0.5 | 6.71e-03 (1.15e-02) | 0.938 (1) |"),
    Headline("GPU, fused: TTFT overhead at 8k tokens, one H200 (a255925)", "+10.6 ms [6.4, 13.2]; "
             "after_forward_ms 11.4 [11.2, 11.8]", "gpu/2026-12-03-s18/ttft-early", "README.md",
             "at 8k +10.6 ms [6.4, 13.2]"),
    Headline("GPU, lossy strategies at 8k tokens (8B shape): TTFT overhead with the harness's checks off",
             "fused_int8 +11.2 ms [5.6, 14.1], fused_fp8 +12.3 [10.0, 14.6] (fused +12.0)",
             "gpu/2026-12-04-s22/ttft-nochecks", "README.md", "+11.2 ms [5.6, 14.1]"),
    Headline("GPU, lossy strategies' accuracy (llama3_8b_kv, 2k tokens): match rate", "fused_int8 0.688 against "
             "fused's 0.75 (its misses near ties); fused_fp8 0.25", "gpu/2026-12-04-s22/lossy/a", "README.md",
             "| fused_int8 at 2048 | 0.5 | 7.30e-03 (1.18e-02) | 0.688 (5) |"),
    Headline("GPU, fused: transfer at 8k (1 GiB) against the same-run copy ceiling", "0.513 ms, 0.99 of the ceiling",
             "gpu/2026-12-03-s18/ttft-early", "README.md", "transfer 0.513 ms (0.99 of the ceiling)"),
    Headline("GPU, fused at 2k tokens", "+10.2 ms [9.4, 11.4]; transfer 0.28 ms, 0.46 of the ceiling",
             "gpu/2026-12-03-s18/ttft-early", "README.md",
             "at 2k +10.2 ms [9.4, 11.4], transfer 0.28 ms (0.46 of the ceiling"),
    Headline("GPU: per_request_blocks and layerwise, TTFT overhead at 8k", "+21.3 ms [19.8, 25.7] and "
             "+11.4 ms [8.4, 14.1]", "gpu/2026-12-03-s16/ttft-early", "README.md",
             "per_request_blocks +21.3 [19.8, 25.7], layerwise +11.4 [8.4, 14.1]"),
    Headline("GPU: the TTFT benchmark's reference (scripts/compare_bench.py, `bash scripts/gpu_run.sh compare`)",
             "every later run compared with it: no cell slower", "gpu/2026-12-02-s14/ttft-early", "README.md",
             "results/gpu/2026-12-02-s14/ttft-early"),
    Headline("GPU: strategies ranked by after_forward_ms at 8k (an nvidia-h200-x2's GPU 0)",
             "fused 11.3 ms [11.1, 11.5], layerwise 11.1 [11.0, 11.3], per_request_blocks 15.5 [14.6, 18.2]",
             "gpu/2026-11-30-s6/ttft-early", "README.md",
             "fused 11.3 ms [11.1, 11.5], layerwise 11.1 [11.0, 11.3], per_request_blocks 15.5 [14.6, 18.2]"),
    Headline("GPU, fused across two H200s (NVLink) at 8k", "3.058 ms = 351 GB/s, 0.90 of the peer-copy ceiling",
             "gpu/2026-11-30-s4/h200-2gpu", "results/gpu/README.md",
             "3.058 ms = 351 GB/s, 0.90 of the peer-copy ceiling"),
    Headline("A sweep of 3 prompt lengths, cold and with engines reused: CPU", "54 s and 39 s",
             "cpu/2026-12-03-s19-engine-reuse/lengths", "README.md", "54 s cold and 39 s reused"),
    Headline("The same on one H200 (CUDA graphs)", "106 s and 50 s", "gpu/2026-12-03-s16/sweep-lengths",
             "README.md", "106 s and 50 s"),
    Headline("A sweep over the 4 strategies, cold and reused: CPU", "65 s and 62 s",
             "cpu/2026-12-03-s19-engine-reuse/strategies", "README.md", "65 s cold, 62 s reused"),
    Headline("CPU, lossy strategies at 448 tokens (workload=corpus): exact-match drop at a quarter of fused's bytes",
             "fused_int8 0.0833, fused_fp8 0.333; fused_int4 (0.156 of the bytes) 0.375",
             "cpu/2026-12-04-s22-lossy/strategies", "README.md",
             "| fused_int8 at 448 | 0.25 | 3.94e-03 (1.05e-02) | 0.0833 |"),
    Headline("CPU serving (fused, 64 requests at 2 and 8 req/s): P/D TTFT", "38.0 [29.7, 75.5] and 42.4 [28.5, 92.7] "
             "ms (colocated 14.4 and 12.1)", "cpu/2026-12-01-s8-serve", "README.md",
             "TTFT: P/D 38.0 [29.7, 75.5] and 42.4 [28.5, 92.7] ms"),
    Headline("What the router adds to TTFT (CPU, 256 pairs)", "0.97 [-0.93, 2.45] ms", "cpu/2026-12-01-s8-router",
             "README.md", "The router adds 0.97 [-0.93, 2.45] ms"),
    Headline("Serving 8k-token prompts on one H200 at 0.5 req/s: what P/D adds to TTFT", "16 ms of 223 ms; 6.6 ms "
             "with the prefill's token streamed", "gpu/2026-12-01-s8/serve-1gpu-low", "README.md",
             "At 0.5 req/s P/D adds 16 ms to a 223 ms TTFT, and 6.6 ms with the prefill's token streamed"),
    Headline("The harness's client against `vllm bench serve` (one H200)", "TTFT 64.7 and 63.9 ms",
             "gpu/2026-12-01-s9/crosscheck-1gpu", "README.md", "TTFT 64.7 and 63.9 ms"),
    Headline("CPU: the first measured request without a warm-up (TTFT overhead)", "24-31 ms against 12 ms",
             "cpu/2026-11-30-s4-warmup", "README.md",
             "TTFT overhead was 24-31 ms without it against 12 ms for the rest"),
    Headline("CPU benchmark (2 cores, tiny-llama): fused at 2048 tokens", "0.620 ms, 0.65 of the copy ceiling",
             "cpu/2026-11-30-s4", "results/cpu/strategies.md", "| fused | 2048 | 0.594 / 0.620 | 0.70 / 0.65 |"),
]
