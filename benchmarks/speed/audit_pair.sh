#!/usr/bin/env bash
# The worst-budget audit of one checkpoint at two commits, one after the other, alone, each on a fresh copy of the
# same store (issue 76's paired measurement): OLD_SRC is the src/ of a worktree of the older commit (run with this
# venv's packages), the newer one is this checkout. Prints each run's wall time and peak RSS (GNU time); the logs,
# with each stage's and trial's seconds, are OUT/old.log and OUT/new.log.
#
#   git worktree add ../old a8a2fda
#   margincal demo out=runs/pair/demo store=runs/pair/base && margincal mini export runs/pair/data --store runs/pair/base
#   bash benchmarks/speed/audit_pair.sh ../old/src runs/pair/base runs/pair/base/unlearn/<GradDiff key>/model \
#       runs/pair/data runs/pair/out
set -euo pipefail
old_src=$1 store_base=$2 model=$3 data=$4 out=$5
python=$(cd "$(dirname "$0")/../.." && pwd)/.venv/bin/python
mkdir -p "$out"
for which in old new; do
  rm -rf "$out/store-$which" "$out/audit-$which"
  cp -a "$store_base" "$out/store-$which"
  ckpt=${model/$store_base/$out/store-$which}
  if [ "$which" = old ]; then src=$old_src; else src=; fi
  PYTHONPATH=$src /usr/bin/time -v "$python" -m margincal.cli audit --model "GradDiff=$ckpt" --data "$data" \
    --budget worst --store "$out/store-$which" --out "$out/audit-$which" > "$out/$which.log" 2> "$out/$which.err"
  echo "$which: $(grep -E 'Elapsed|Maximum resident' "$out/$which.err" | tr -s ' \t' ' ' | tr '\n' ';')"
done
