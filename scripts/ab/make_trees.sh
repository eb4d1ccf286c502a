#!/usr/bin/env bash
# Build code-only source trees of the project at several commits, for an A/B on the GPU machine.
#
#   bash scripts/ab/make_trees.sh [REPO] [DEST]          (defaults: this checkout, REPO/.bench)
#   TREES="old=0c04ef7 int64=95980bd new=HEAD" bash scripts/ab/make_trees.sh
#   TREES="old=dabfb97 new=HEAD" MODELS=tiny-llama bash scripts/ab/make_trees.sh   # for a CPU A/B
#
# Each tree DEST/<name>/ holds only what a TTFT benchmark run needs (git archive of the commit):
#   harness/ transfer_strategies/ conf/ scripts/ models/<each of MODELS>/ (default llama3-8b-shape:
#   config + tokenizer, load_format=dummy, no weights; tiny-llama for the CPU, its weights
#   included)  and a COMMIT file with the full sha.
# No results/, tests/, notebooks/, models with weights. The A/B scripts (gpu_ab.sh, ab_report.py,
# digest_ab.py) are copied into DEST too, so that they travel to the device with the tree
# (DEST is git-ignored through .git/info/exclude: name it in the device tool's `carry`).
# Writes nothing in REPO outside DEST and .git/info/exclude; reads the repository with git archive only.
set -euo pipefail
REPO=${1:-$(git rev-parse --show-toplevel)}
DEST=${2:-$REPO/.bench}
TREES=${TREES:-"old=0c04ef7 int64=95980bd new=HEAD"}
MODELS=${MODELS:-llama3-8b-shape}
PATHS=(harness transfer_strategies conf scripts)
for m in $MODELS; do PATHS+=("models/$m"); done
HERE=$(cd "$(dirname "$0")" && pwd)

# keep DEST out of git status, and out of what travels unless carried
rel=${DEST#"$REPO"/}
if [ "$rel" != "$DEST" ]; then
  exclude="$REPO/.git/info/exclude"
  grep -qxF "/$rel/" "$exclude" 2>/dev/null || echo "/$rel/" >> "$exclude"
fi

mkdir -p "$DEST"
for spec in $TREES; do
  name=${spec%%=*}; rev=${spec#*=}
  sha=$(git -C "$REPO" rev-parse --verify "$rev^{commit}")
  out="$DEST/$name"
  rm -rf "$out"; mkdir -p "$out"
  # only the paths that exist at that commit (models/llama3-8b-shape exists at every commit used here)
  have=()
  for p in "${PATHS[@]}"; do
    if git -C "$REPO" cat-file -e "$sha:$p" 2>/dev/null; then have+=("$p"); else echo "note: $p not in $rev" >&2; fi
  done
  git -C "$REPO" archive --format=tar "$sha" -- "${have[@]}" | tar -x -C "$out"
  echo "$sha" > "$out/COMMIT"
  git -C "$REPO" log -1 --format='%h %s' "$sha" | cut -c1-120 >> "$out/COMMIT"
done

for f in gpu_ab.sh ab_report.py digest_ab.py; do
  [ -f "$HERE/$f" ] && cp "$HERE/$f" "$DEST/$f"
done

echo "trees in $DEST:"
for spec in $TREES; do
  name=${spec%%=*}
  printf '  %-6s %s  (%s)\n' "$name" "$(du -sh "$DEST/$name" | cut -f1)" "$(head -c 12 "$DEST/$name/COMMIT")"
done
du -sh "$DEST" | sed 's/^/  total /'
