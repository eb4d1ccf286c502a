#!/usr/bin/env bash
# A/B of the fused TTFT benchmark between source trees, on the GPU machine, alternating runs.
#
#   bash .bench/gpu_ab.sh                    # trees .bench/old (A) and .bench/new (B), ORDER=ABABAB
#   bash .bench/gpu_ab.sh DIR_A DIR_B        # any two trees
#   TREE_C=.bench/new EXTRA_C="check.digests=false" ORDER=ABCABC bash .bench/gpu_ab.sh
#   EXPERIMENT=cpu_bench PYTHON=$PWD/.venv/bin/python DIGEST_AB=0 bash .bench/gpu_ab.sh   # on the CPU
#
# Each run, from inside its tree, with that tree alone on PYTHONPATH (plus vLLM's /tmp/site):
#   python3 scripts/bench_strategies.py --experiment $EXPERIMENT --out DIR -- "bench.lengths=[2048,8192]"
#     bench.per_length=12 "bench.strategies=[fused]" "bench.decode_submit=[early]" $EXTRA_<label>
# (the same CLI at 0c04ef7 and at HEAD: --experiment, --out, harness overrides after --).
# One engine start per run (three engines on GPU 0, CUDA graphs on); runs alternate A, B, A, B...
# while the time budget lasts (BUDGET_S, default 480 s: a run starts only if the last run's
# duration, plus 20 s, still fits). First run about 90-120 s (vLLM's torch.compile cache cold),
# later ones about 45-60 s (engine start-up 25-35 s, 24 baseline + 1 warm-up + 24 P/D requests,
# the two copy-ceiling probes, the table): 6-8 runs in 8 minutes.
#
# Needs: vLLM installed there (. /tmp/site/env.sh, as ../shared/gpu/README.md says); the trees
# (bash scripts/ab/make_trees.sh, which copies this script beside them; name .bench in the
# device tool's carry: it is git-ignored). Writes into $OUT (the device tool's; default
# .bench/out): ab_report.md (tables), ab_requests.csv, ab_transfers.csv, ab_runs.tgz (every run's
# records, summaries and logs), ab_env.txt (machine, kernel: 4.4.0 is gVisor), ab_console.txt,
# and digest_ab.txt when DIGEST_AB=1 (the default: digest_ab.py over every tree first, ~1 min).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
TREE_A=$(cd "${1:-${TREE_A:-$HERE/old}}" && pwd)
TREE_B=$(cd "${2:-${TREE_B:-$HERE/new}}" && pwd)
ORDER=${ORDER:-ABABABAB}
EXPERIMENT=${EXPERIMENT:-gpu_ttft}  # cpu_bench: the same A/B on the CPU (trees with MODELS=tiny-llama)
PYTHON=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-480}
LENGTHS=${LENGTHS:-2048,8192}
PER_LENGTH=${PER_LENGTH:-12}
STRATEGIES=${STRATEGIES:-fused}   # e.g. fused,per_request_blocks (each its own engine start: fewer rounds)
DIGEST_AB=${DIGEST_AB:-1}
OUT=${OUT:-$HERE/out}
WORK=${WORK:-/tmp/ab-$(date +%H%M%S)}
mkdir -p "$OUT" "$WORK"
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }

# vLLM's bundle; nothing else of the caller's PYTHONPATH (a tree must see only its own code)
export PYTHONPATH=
[ -f /tmp/site/env.sh ] && . /tmp/site/env.sh
SITE_PP=${PYTHONPATH:-}
export PYTHONUNBUFFERED=1

console="$OUT/ab_console.txt"
{
  echo "date: $(date -u +%FT%TZ)"; echo "kernel: $(uname -r)  (4.4.0: gVisor; *-fc-*: Firecracker)"
  echo "cpus: $(nproc)  $(grep -m1 'model name' /proc/cpuinfo)"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.limit,temperature.gpu,utilization.gpu --format=csv 2>&1
  nvidia-smi -q -d COMPUTE,PERFORMANCE 2>&1 | grep -E "Compute Mode|Throttle|Slowdown|Active|Idle" | head -20
  "$PYTHON" -c "import sys, torch, triton, vllm; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'vllm', vllm.__version__)" 2>&1 | tail -1
  for L in A B C D; do v=TREE_$L; [ -n "${!v:-}" ] && echo "tree $L: ${!v} $(head -1 "${!v}/COMMIT" 2>/dev/null)"; done
  echo "order $ORDER, budget ${BUDGET_S}s, experiment $EXPERIMENT, lengths $LENGTHS x $PER_LENGTH, strategies $STRATEGIES"
} > "$OUT/ab_env.txt" 2>&1
cat "$OUT/ab_env.txt"
export TREE_A TREE_B

if [ "$DIGEST_AB" = 1 ]; then
  trees=()
  for L in A B C D; do v=TREE_$L; [ -n "${!v:-}" ] && trees+=("${!v}"); done
  [ -d "$HERE/int64" ] && trees+=("$HERE/int64")  # 95980bd: int64 products, one digest per block (before per-head)
  # one process per distinct tree
  mapfile -t trees < <(printf '%s\n' "${trees[@]}" | awk '!seen[$0]++')
  timeout 180 "$PYTHON" "$HERE/digest_ab.py" "${trees[@]}" --out "$OUT/digest_ab.txt" 2>&1 | tail -30
  echo "[ab] digest_ab done at $(elapsed)s"
fi

last=0; i=0; declare -A rounds
for (( k=0; k<${#ORDER}; k++ )); do
  L=${ORDER:$k:1}
  tv=TREE_$L; ev=EXTRA_$L
  tree=${!tv:-}; extra=${!ev:-}
  [ -z "$tree" ] && { echo "[ab] no TREE_$L: skipped"; continue; }
  tree=$(cd "$tree" && pwd)
  left=$(( BUDGET_S - $(elapsed) ))
  need=$(( last > 0 ? last + 20 : 150 ))
  if (( left < need )); then echo "[ab] $(elapsed)s: ${left}s left, a run needs ~${need}s: stop"; break; fi
  i=$((i + 1)); rounds[$L]=$(( ${rounds[$L]:-0} + 1 ))
  dir="$WORK/$(printf %02d $i)-$L"
  commit=$(head -1 "$tree/COMMIT" 2>/dev/null || echo unknown)
  echo "[ab] $(elapsed)s: run $i = $L (round ${rounds[$L]}), tree $tree ${commit:0:10}, extra: ${extra:-none}" | tee -a "$console"
  t=$(date +%s)
  # shellcheck disable=SC2086  # EXTRA_<label> holds several overrides on purpose
  ( set -f; cd "$tree" && PYTHONPATH="$tree${SITE_PP:+:$SITE_PP}" timeout -s INT $(( left > 60 ? left + 30 : 90 )) \
      "$PYTHON" scripts/bench_strategies.py --experiment "$EXPERIMENT" --out "$dir" -- \
      "bench.lengths=[$LENGTHS]" "bench.per_length=$PER_LENGTH" "bench.strategies=[$STRATEGIES]" \
      "bench.decode_submit=[early]" $extra ) > "$WORK/$(printf %02d $i)-$L.console" 2>&1
  rc=$?
  last=$(( $(date +%s) - t ))
  mkdir -p "$dir"
  "$PYTHON" -c 'import json, sys; a = sys.argv[1:]; print(json.dumps({"label": a[0], "round": int(a[1]), "index": int(a[2]),
    "tree": a[3], "commit": a[4], "extra": a[5], "rc": int(a[6]), "seconds": int(a[7])}))' \
    "$L" "${rounds[$L]}" "$i" "$(basename "$tree")" "$commit" "$extra" "$rc" "$last" > "$dir/AB.json"
  { echo "[ab] run $i ($L) exit $rc in ${last}s"; grep -v "^\[" "$WORK/$(printf %02d $i)-$L.console" | tail -14; } | tee -a "$console"
done

echo "[ab] runs done at $(elapsed)s" | tee -a "$console"
"$PYTHON" "$HERE/ab_report.py" "$WORK" --out "$OUT" > /dev/null 2>>"$console" || echo "[ab] report failed" | tee -a "$console"
sed -n '1,200p' "$OUT/ab_report.md" 2>/dev/null | head -120
# every run's records and logs (not the prompts: the same seeded file in every run, nor figures)
tar czf "$OUT/ab_runs.tgz" -C "$WORK" --exclude='prompts.jsonl' --exclude='*.png' . 2>>"$console"
ls -la "$OUT"
echo "[ab] all done at $(elapsed)s"
