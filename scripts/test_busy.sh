#!/usr/bin/env bash
# make test from a fresh clone while another process keeps every core busy for the whole run: a
# test that passes only on an idle machine fails users, whose laptops are busy machines. Run it
# before a submission that touches tests or anything timed; tests/TIERS.md keeps the last time.
#
#   bash scripts/test_busy.sh [REPO] [DIR]     (defaults: this checkout's HEAD, /tmp/busy-<time>)
#
# The load: one busy loop per core (nproc), at the same priority as the tests, from before the
# set-up until make test ends. Writes DIR/make-test.log; exits with make test's code.
set -euo pipefail
REPO=${1:-$(git rev-parse --show-toplevel)}
DIR=${2:-/tmp/busy-$(date +%Y%m%d-%H%M%S)}
git clone -q "$REPO" "$DIR"
cd "$DIR"
pids=()
for _ in $(seq "$(nproc)"); do python3 -c 'while True: pass' & pids+=($!); done
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
start=$(date +%s)
set +e
make test 2>&1 | tee make-test.log
code=${PIPESTATUS[0]}
set -e
echo "make test at $(git rev-parse --short HEAD) beside $(nproc) busy loops: exit $code in $(( $(date +%s) - start )) s" \
  | tee -a make-test.log
exit "$code"
