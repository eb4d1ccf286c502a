"""Imported by the engines' server (harness/forkserver.py) before it forks: process-wide answers
torch.compile looks up at an engine's first request, computed once instead of in every engine.

vLLM's sampler compiles a small function (`batched_count_greater_than`) at the first request that
asks for log-probabilities, which the harness's requests do. Even with inductor's cache on disk
warm, that took 2.7 s of an engine's start-up on the 2-core machine, 1.8 s of it answers that do
not depend on the engine: which vector instructions the CPU has (six compiler probes), and hashes
of torch's and Triton's sources. Each is cached for the process, and a forked engine inherits the
cache. Nothing is compiled or run here: a compiled kernel run here would start OpenMP threads,
and an engine forked after that hangs at its first parallel region."""

from torch._inductor import codecache, cpu_vec_isa

cpu_vec_isa.pick_vec_isa()
codecache.torch_key()
codecache.triton_key()
