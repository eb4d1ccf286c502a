#!/usr/bin/env bash
# GPU runs on the device machine (one H100 or H200, vLLM 0.26 from ../shared/gpu's bundle, already
# installed and sourced). Writes logs and result tables under $OUT (default results/gpu).
#   bash scripts/gpu_run.sh check    # tests/test_gpu.py: every strategy matches the baseline on CUDA (pytest args follow)
#   bash scripts/gpu_run.sh bench    # experiment=gpu_bench: Llama-3-8B shape, 512/2k/8k/16k tokens, one GPU
#   bash scripts/gpu_run.sh bench2   # the same with prefill on GPU 0 and decode on GPU 1
#   bash scripts/gpu_run.sh ttft     # experiment=gpu_ttft: TTFT and its parts, early vs after_prefill, 2k/8k/16k
#   bash scripts/gpu_run.sh ttft2    # the same across two GPUs
#   bash scripts/gpu_run.sh compare  # scripts/compare_bench.py: the benchmark $RUNS/$NAME (default ttft) against $REF,
#                                    # by default the committed reference of the GPU it ran on (harness/report/compare.py
#                                    # REFERENCES); exit 1 when a cell is slower (its args follow)
#   bash scripts/gpu_run.sh kvmodel  # train and check models/llama3-8b-kv (Llama-3-8B KV geometry, trained weights)
#   bash scripts/gpu_run.sh lossy    # experiment=gpu_lossy: fused and the lossy strategies on llama3_8b_kv (kvmodel first),
#                                    # 2k/8k/16k (LENGTHS=2048,8192 STRATEGIES=fused,fused_int8; SWEEP names the sweep's
#                                    # directory under $RUNS/$NAME), then lossy_report.py over all of $RUNS/$NAME
#   bash scripts/gpu_run.sh lossy-stored  # the same with fused and both engines storing FP8 (kv_cache_dtype), into the same report
#   bash scripts/gpu_run.sh probe    # scripts/gpu_copy_probe.py, on one GPU and (if there are two) across
#   bash scripts/gpu_run.sh codecs   # scripts/bench_codecs.py --check: the codec kernels against torch, then each codec's
#                                    # send and receive beside fused's gather and scatter at TOKENS (default 2048 8192 16384)
#   bash scripts/gpu_run.sh links    # which strategy wins on which link: STRATEGIES (fused,layerwise,chunkwise) over
#                                    # transport=nixl on the same GPU and across veth links of RATES Gbit/s (10,5), the
#                                    # benchmark's prompts (LENGTHS 2k/8k/16k x PER_LENGTH 6), every engine prefilling in
#                                    # chunks of CHUNK (2048) tokens; two multiruns, each strategy's engines started once
#                                    # in each (kept across the speeds); then link_report.py. Root, ip and tc; EXPERIMENT
#                                    # (gpu_ttft) names another setup (cpu_bench: the same on the CPU, tests/test_link_cpu.py)
#   bash scripts/gpu_run.sh mla      # issue 49: the trained tiny MLA model on CUDA (check -k mla: fused, layerwise, fused_int8,
#                                    # CUDA graphs), then ttft with DeepSeek-V3's layer shape (model=deepseek_v3_shape; NAME
#                                    # ttft-mla, STRATEGIES fused,layerwise,fused_int8, early submission; ROUND=k as for ttft)
#   bash scripts/gpu_run.sh serve    # experiment=gpu_serve: runner=serve sweep on two GPUs (harness overrides follow,
#                                    # e.g. strategy=fused,layerwise serve.request_rate=1,2,4)
#   bash scripts/gpu_run.sh serve1   # experiment=gpu_serve_1gpu: the same on one GPU, 1P1D against two colocated replicas,
#                                    # the trained llama3_8b_kv (kvmodel first)
# What bench runs is conf/experiment/gpu_bench.yaml (full_cache's 2.5 GiB cache: gpu_bench/full_cache.yaml);
# harness overrides follow (bench.lengths=[512,2048]), or LENGTHS=512,2048 PER_LENGTH=1 STRATEGIES=fused STARTS=3;
# ROUND=k runs engine start k of each strategy only, into the same $RUNS/$NAME (one call per round).
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-results/gpu}   # run directories
OUT=${OUT:-$RUNS}           # where the tables and summaries are copied (the device tool's $OUT)
mkdir -p "$RUNS" "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
FIT=()  # harness overrides that fit three Llama-3-8B-shape engines on a GPU under 100 GiB (an 80 GB H100)
case "${1:-check}" in check|bench|bench2|ttft|ttft2|compare|serve|serve1|kvmodel|lossy|lossy-stored|links|codecs|probe|mla) ;;
  *) echo "error: gpu_run.sh: no recipe ${1@Q} (the comment at its top lists them)" >&2; exit 2 ;;
esac
# compare reads records only: it keeps the gpu.txt of the run it checks
if [ "${1:-check}" != compare ] && command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
  python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" >> "$OUT/gpu.txt" 2>&1
  mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 2>/dev/null || echo 0)
  # there the baseline engine runs its pass alone, then the prefill and decode engines start; what does
  # not fit even so, harness/gpu_fit.py refuses (exit 2, one line) before any engine starts
  if [ "${mib:-0}" -gt 0 ] && [ "$mib" -lt 102400 ]; then
    FIT=(run.overlap_startup=false); echo "GPU 0 has $mib MiB: ${FIT[*]}" | tee -a "$OUT/gpu.txt"
  fi
fi
ok() {  # $1: the runs' exit code, $2 (optional): their table's rows; false (and why) where one failed or none was written
  local rows=${2:-}
  if [ "$1" != 0 ]; then echo "FAILED: exit code $1" >&2; return 1; fi
  if [ -n "$rows" ] && { [ ! -f "$rows" ] || [ "$(wc -l < "$rows")" -lt 2 ]; }; then
    echo "FAILED: no table rows in $rows" >&2; return 1
  fi
}
case "${1:-check}" in
  check)
    HARNESS_TEST_RESULTS=$PWD/results/tests python3 -m pytest -q tests/test_gpu.py "${@:2}" 2>&1 | tail -30
    code=${PIPESTATUS[0]}
    for d in results/tests/gpu-*/; do
      [ -f "$d/summary.json" ] && cp "$d/summary.json" "$OUT/check-$(basename "$d").summary.json"
    done
    ok "$code" || exit 1 ;;
  bench|bench2|ttft|ttft2)
    name=${NAME:-$1}; two=(); [ "${1: -1}" = 2 ] && two=(--two-gpus)
    experiment=gpu_bench; [ "${1#ttft}" != "$1" ] && experiment=gpu_ttft
    python3 scripts/bench_strategies.py --experiment $experiment "${two[@]}" --out "$RUNS/$name" ${ROUND:+--round $ROUND} \
      -- "${FIT[@]}" \
      ${LENGTHS:+"bench.lengths=[$LENGTHS]"} ${PER_LENGTH:+"bench.per_length=$PER_LENGTH"} \
      ${STRATEGIES:+"bench.strategies=[$STRATEGIES]"} ${STARTS:+"bench.engine_starts=$STARTS"} "${@:2}" 2>&1 \
      | grep -v "^\[" | tail -40
    code=${PIPESTATUS[0]}
    cp "$RUNS/$name/table.md" "$OUT/$name-table.md" 2>/dev/null
    cp "$RUNS/$name/rows.csv" "$OUT/$name-rows.csv" 2>/dev/null
    cp "$RUNS/$name/figure.png" "$OUT/$name-figure.png" 2>/dev/null
    [ -d "$RUNS/$name" ] && tar czf "$OUT/$name-runs.tgz" -C "$RUNS" "$name"  # every run's records and logs
    ok "$code" "$RUNS/$name/rows.csv" || exit 1 ;;
  compare)  # after a change on the transfer path: the new ttft benchmark against the committed reference
    name=${NAME:-ttft}
    python3 scripts/compare_bench.py "$RUNS/$name" ${REF:+"$REF"} "${@:2}" 2>&1 \
      | tee "$OUT/${name//\//-}-compare.txt"
    exit "${PIPESTATUS[0]}" ;;
  serve|serve1)
    name=${NAME:-$1}; experiment=gpu_serve; [ "$1" = serve1 ] && experiment=gpu_serve_1gpu
    # two 8B-shape instances a GPU with 24 GiB of KV each need 79.1 GiB: on 80 GB cards 16 GiB each
    fit=(); [ "$1" = serve ] && [ ${#FIT[@]} -gt 0 ] && fit=(engine.kv_cache_gib=16)
    python3 -m harness -m experiment=$experiment "hydra.sweep.dir=$RUNS/$name" "${fit[@]}" "${@:2}" 2>&1 \
      | grep -v "^\[" | tail -60
    code=${PIPESTATUS[0]}
    cp "$RUNS/$name/sweep_summary.txt" "$OUT/$name-summary.txt" 2>/dev/null
    tar czf "$OUT/$name-runs.tgz" -C "$RUNS" "$name"
    ok "$code" && [ -s "$RUNS/$name/sweep_summary.txt" ] || exit 1 ;;
  kvmodel)  # models/llama3-8b-kv: the Llama-3-8B KV geometry, trained here (its weights are not committed), then checked
    python3 scripts/train_default_model.py --preset llama3_8b_kv --device cuda --out models/llama3-8b-kv 2>&1 | tail -12
    ok "${PIPESTATUS[0]}" || exit 1
    python3 scripts/check_default_model.py --model models/llama3-8b-kv --device cuda --hf-device cuda --update-card \
      2>&1 | grep -v "^\[" | tail -40
    code=${PIPESTATUS[0]}
    cp models/llama3-8b-kv/README.md models/llama3-8b-kv/training_info.json "$OUT/"
    ok "$code" || exit 1 ;;
  lossy|lossy-stored)
    name=${NAME:-lossy}; what=("${SWEEP:-strategies}" "strategy=${STRATEGIES:-fused,fused_fp8,fused_int8,fused_int4}")
    [ "$1" = lossy-stored ] && what=("${SWEEP:-kv_cache_fp8}" strategy=fused 'engines.prefill={kv_cache_dtype:fp8}'
                                     'engines.decode={kv_cache_dtype:fp8}')
    python3 -m harness -m experiment=gpu_lossy "hydra.sweep.dir=$RUNS/$name/${what[0]}" "${what[@]:1}" \
      "workload.prompt_len=${LENGTHS:-2048,8192,16384}" "${@:2}" 2>&1 | grep -v "^\[" | tail -40
    code=${PIPESTATUS[0]}
    python3 scripts/lossy_report.py "$RUNS/$name" --out "$OUT/$name-report.md" --figure "$OUT/$name-figure.png" || code=1
    tar czf "$OUT/$name-runs.tgz" -C "$RUNS" "$name"
    ok "$code" || exit 1 ;;
  links)
    name=${NAME:-links}; d=$RUNS/$name; lengths=${LENGTHS:-2048,8192,16384}
    mkdir -p "$d"
    python3 -c "from harness.workload import bench_prompts; print(bench_prompts([$lengths], ${PER_LENGTH:-6}), end='')" \
      > "$d/prompts.jsonl"
    # the benchmark's harness settings (harness/benchmark.py: Plan.harness_overrides); the link speeds last, so that
    # Hydra varies them fastest and a strategy's kept engines serve all of them
    common=("experiment=${EXPERIMENT:-gpu_ttft}" "strategy=${STRATEGIES:-fused,layerwise,chunkwise}" transport=nixl "${FIT[@]}"
            workload=jsonl "workload.path=$d/prompts.jsonl" sampling.max_tokens=4 run.decode_submit=early
            "engine.max_model_len=$(( $(tr , '\n' <<< "$lengths" | sort -n | tail -1) + 64 ))"
            "engine.extra={max_num_batched_tokens:${CHUNK:-2048}}")
    code=0
    python3 -m harness -m "${common[@]}" "hydra.sweep.dir=$d/same" "${@:2}" > "$d/same.log" 2>&1 || code=1
    python3 -m harness -m "${common[@]}" link=veth "link.rate_gbit=${RATES:-10,5}" "hydra.sweep.dir=$d/links" "${@:2}" \
      > "$d/links.log" 2>&1 || code=1
    grep -h -A12 "^sweep summary" "$d/same.log" "$d/links.log"
    python3 scripts/link_report.py "$d" --out "$OUT/$name-link_report.md" --figure "$OUT/$name-ttft_vs_link.png" \
      2>&1 | tail -40
    [ "${PIPESTATUS[0]}" = 0 ] || code=1
    tar czf "$OUT/$name-runs.tgz" -C "$RUNS" "$name"
    exit $code ;;
  mla)
    code=0
    bash "$0" check -k mla || code=1
    NAME=${NAME:-ttft-mla} STRATEGIES=${STRATEGIES:-fused,layerwise,fused_int8} bash "$0" ttft "bench.decode_submit=[early]" \
      model=deepseek_v3_shape "${@:2}" || code=1
    exit $code ;;
  codecs)
    python3 scripts/bench_codecs.py --device cuda --preset llama3_8b --tokens ${TOKENS:-2048 8192 16384} --check "${@:2}" \
      2>&1 | grep -v "^\[" | tee "$OUT/${NAME:-bench_codecs}.md"
    exit "${PIPESTATUS[0]}" ;;
  probe)
    python3 scripts/gpu_copy_probe.py 2>&1 | tee "$OUT/copy-probe-1gpu.txt"
    ok "${PIPESTATUS[0]}" || exit 1
    if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
      python3 scripts/gpu_copy_probe.py --peer 2>&1 | tee "$OUT/copy-probe-2gpu.txt"
      ok "${PIPESTATUS[0]}" || exit 1
    fi ;;
esac
