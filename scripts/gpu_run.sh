#!/usr/bin/env bash
# GPU runs on the device machine (one H200, vLLM 0.26 from ../shared/gpu's bundle, already
# installed and sourced). Writes logs and result tables under $OUT (default results/gpu).
#   bash scripts/gpu_run.sh check    # default model: fused and per_request_blocks match the baseline
#   bash scripts/gpu_run.sh bench    # Llama-3-8B shape, 512/2k/8k/16k tokens, one GPU
#   bash scripts/gpu_run.sh bench2   # the same with prefill on GPU 0 and decode on GPU 1
#   bash scripts/gpu_run.sh probe    # scripts/gpu_copy_probe.py, on one GPU and (if there are two) across
# full_cache runs with a 2.5 GiB cache (it moves the whole cache per request; 16k tokens need 2 GiB).
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-results/gpu}   # run directories
OUT=${OUT:-$RUNS}           # where the tables and summaries are copied (the device tool's $OUT)
mkdir -p "$RUNS" "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" >> "$OUT/gpu.txt" 2>&1
case "${1:-check}" in
  check)
    for s in fused per_request_blocks layerwise; do
      python3 -m harness device=cuda strategy=$s workload=synthetic workload.prompt_len=300 \
        workload.num_prompts=6 workload.concurrency=2 "hydra.run.dir=$RUNS/check-$s" "${@:2}" 2>&1 | tail -14
      cp "$RUNS/check-$s/summary.json" "$OUT/check-$s.summary.json" 2>/dev/null
    done ;;
  bench|bench2)
    name=$1; two=(); [ "$1" = bench2 ] && two=(--two-gpus)
    python3 scripts/bench_strategies.py --device cuda "${two[@]}" --lengths "${LENGTHS:-512,2048,8192,16384}" \
      --per-length "${PER_LENGTH:-2}" --strategies "${STRATEGIES:-fused,layerwise,per_request_blocks,full_cache}" \
      --set full_cache:engine.kv_cache_gib=2.5 \
      --out "$RUNS/$name" -- model=llama3_8b_shape engine.gpu_memory_utilization=0.28 engine.kv_cache_gib=16 \
      "${@:2}" 2>&1 | grep -v "^\[" | tail -40
    cp "$RUNS/$name/table.md" "$OUT/$name-table.md" 2>/dev/null
    cp "$RUNS/$name/rows.csv" "$OUT/$name-rows.csv" 2>/dev/null
    cp "$RUNS/$name/figure.png" "$OUT/$name-figure.png" 2>/dev/null
    tar czf "$OUT/$name-runs.tgz" -C "$RUNS" "$name" ;;  # every run's records and logs
  probe)
    python3 scripts/gpu_copy_probe.py 2>&1 | tee "$OUT/copy-probe-1gpu.txt"
    if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then python3 scripts/gpu_copy_probe.py --peer 2>&1 | tee "$OUT/copy-probe-2gpu.txt"; fi ;;
esac
