#!/usr/bin/env bash
# The same sweep twice, cold (run.reuse_engines=false: every job starts its engines) and with
# engines reused between jobs (the default), then scripts/compare_sweeps.py's table of the two
# (wall time, engine start-ups, and whether every job's verdict, outputs and digests are the same).
#   bash scripts/sweep_reuse.sh OUT harness overrides ...   # e.g. OUT strategy=fused workload=synthetic workload.prompt_len=64,256,1024
# Writes OUT/cold and OUT/reused (Hydra sweep directories, each with command.txt and
# sweep_wall_s.txt) and OUT/compare.md; exits as compare_sweeps.py does (1: a job differs).
set -uo pipefail
cd "$(dirname "$0")/.."
out=$1; shift
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
for mode in cold reused; do
  extra=(); [ $mode = cold ] && extra=(run.reuse_engines=false)
  mkdir -p "$out/$mode"
  cmd=("$PY" -m harness -m "hydra.sweep.dir=$out/$mode" "${extra[@]}" "$@")
  echo "${cmd[*]}" > "$out/$mode/command.txt"
  t0=$(date +%s.%N)
  "${cmd[@]}" > "$out/$mode/sweep.log" 2>&1
  echo "exit $?" >> "$out/$mode/sweep.log"
  echo "$(date +%s.%N) $t0" | awk '{printf "%.1f\n", $1 - $2}' > "$out/$mode/sweep_wall_s.txt"
done
"$PY" scripts/compare_sweeps.py "$out/cold" "$out/reused" | tee "$out/compare.md"
exit "${PIPESTATUS[0]}"
