#!/usr/bin/env bash
# Session 39's GPU run (issue 48 item 4): this project's strategies and vLLM's connectors on the same
# engines and prompts, one engine start each, 2k and 8k tokens, each strategy's own decode submission.
# Run on the device machine from the repository root, once every .gpu/part-NN is in /tmp/gpu-parts.
set -uo pipefail
[ -f /tmp/site/env.sh ] || bash .gpu/install.sh | tail -1
# Mooncake's CUDA engine loads libibverbs, libmlx5, libnuma and CUDA 12's runtime, which the machine
# lacks: NIXL's package carries the first three (as `make setup` links them on the CPU), the bundle
# the last (nvidia-cuda-runtime-cu12).
[ -d /tmp/site/mooncake ] && ( cd /tmp/site/mooncake && for f in ../nixl_cu13.libs/lib{ibverbs,mlx5,nl-3,nl-route-3,numa,curl}-*; do ln -sf "$f" .; done \
  && ln -sf libibverbs-*.so.* libibverbs.so.1 && ln -sf libmlx5-*.so.* libmlx5.so.1 && ln -sf libnuma-*.so.* libnuma.so.1 \
  && ln -sf ../nvidia/cuda_runtime/lib/libcudart.so.12 . \
  && { ldconfig -p | grep -q 'libcurl.so.4 ' || ln -sf libcurl-*.so.* libcurl.so.4; } )
. /tmp/site/env.sh
mkdir -p /tmp/runs
strategies=${STRATEGIES:-vllm_nixl,fused,layerwise}
if [ "${strategies/vllm_mooncake/}" != "$strategies" ] && ! python3 -c "import mooncake.engine" > /tmp/runs/mooncake-import.txt 2>&1; then
  ldd /tmp/site/mooncake/engine.so | grep "not found" >> /tmp/runs/mooncake-import.txt
  strategies=${strategies/vllm_mooncake,/}
fi
python3 -c "import nixl, vllm; print('nixl ok, vllm', vllm.__version__)" > /tmp/runs/nixl-import.txt 2>&1
echo "strategies: $strategies" | tee /tmp/runs/strategies.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv -l 2 > /tmp/runs/clocks.csv &
STRATEGIES=$strategies LENGTHS=2048,8192 PER_LENGTH=6 STARTS=1 NAME=connectors RUNS=/tmp/runs OUT=/tmp/runs \
  bash scripts/gpu_run.sh ttft "bench.decode_submit=[]" > /tmp/runs/bench.log 2>&1
echo "exit $?" >> /tmp/runs/bench.log
kill %1 2>/dev/null
