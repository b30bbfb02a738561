#!/usr/bin/env bash
# The prepared GPU work on a lent machine, from a bare start: the acceptance run (benchmarks/gpu/acceptance.py says
# what it measures), then the GPU testbed (benchmarks/gpu/testbed.py, by results/testbed-gpu/PLAN.md).
# Here first: .venv/bin/python benchmarks/gpu/prepare.py   (the wheels the machine lacks, into .gpu-carry/)
# Then two device-tool calls, the second right after the first (the machine stays warm):
#   run(command="bash benchmarks/gpu/run.sh", carry=[".gpu-carry"], timeout_s=230)
#   run(command="bash benchmarks/gpu/run.sh testbed", carry=[".gpu-carry"], timeout_s=540)
# Extra arguments go to the script (e.g. --budget 150, or testbed --half mc --premises FILE).
# Results: $OUT/acceptance.{json,md} or $OUT/testbed.{json,md}, premises.{json,md}, cells.json; and $OUT/run.log.
set -uo pipefail
SCRIPT=acceptance
if [ "${1:-}" = testbed ]; then
    SCRIPT=testbed
    shift
fi
OUT=${OUT:-runs/$SCRIPT}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if compgen -G ".gpu-carry/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/margincal-site \
        .gpu-carry/*.whl 2>&1 | tail -3
    export PYTHONPATH=/tmp/margincal-site:$PWD/src
else
    echo "no .gpu-carry/ wheels: run benchmarks/gpu/prepare.py here and carry .gpu-carry" >&2
    export PYTHONPATH=$PWD/src
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -2
python3 "benchmarks/gpu/$SCRIPT.py" --out "$OUT" --work "/tmp/margincal-$SCRIPT" "$@" 2>&1 | tee "$OUT/run.log"
