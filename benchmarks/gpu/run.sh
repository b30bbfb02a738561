#!/usr/bin/env bash
# The GPU acceptance run on a lent machine, from a bare start (benchmarks/gpu/acceptance.py says what it measures).
# Here first: .venv/bin/python benchmarks/gpu/prepare.py   (the wheels the machine lacks, into .gpu-carry/)
# Then one device-tool call:  run(command="bash benchmarks/gpu/run.sh", carry=[".gpu-carry"], timeout_s=480)
# Extra arguments go to acceptance.py (e.g. --budget 300 --npo-steps 20). Results: $OUT/acceptance.{json,md}, run.log.
set -uo pipefail
OUT=${OUT:-runs/acceptance}
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
python3 benchmarks/gpu/acceptance.py --out "$OUT" --work /tmp/margincal-acceptance "$@" 2>&1 | tee "$OUT/run.log"
