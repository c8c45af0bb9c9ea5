#!/usr/bin/env bash
# The GPU checks of the speed work (the original's sentiment shapes in episodes/s, the CUDA tests, the NCCL runs of
# the scaling benchmark) as one prepared call, for a GPU machine lent for minutes with no network:
#
#   bash scripts/gpu_kit.sh pack            # here: .gpu/ gets the wheels the GPU image lacks and the offline assets
#   bash scripts/gpu_kit.sh bench|tests|all # there, with .gpu carried: logs and JSON under $OUT (else ./gpu-out)
#
# bench (at most 7 min) and tests (at most 9.5 min) fit one 10-minute call each; all is both.
#
# pack needs the package registry and the asset cache of `scripts/setup.sh`; the parts need CUDA, a python3 with
# torch, transformers, peft, accelerate, tensorboard and matplotlib, and nothing from the network. Each step runs under
# its own timeout, so one that hangs leaves the rest their time. docs/benchmarks.md, "On a lent GPU", says more.
set -euo pipefail
cd "$(dirname "$0")/.."
KIT=.gpu
# What lmprefs imports at run time (the query cleaner, the VADER labeler) that the lent GPU image does not hold; pack
# takes the versions installed here.
WHEELS=(ftfy wcwidth vaderSentiment)
# The assets the tiny preset, the CUDA tests and the random GPT-2 124M of the benchmarks read (about 27 MB).
ASSETS=(austen gpt2-tokenizer tiny-gpt2 tiny-gpt2-austen)
PY=${PYTHON:-python3}

pack() {
  local cache=${LMPREFS_CACHE:-$HOME/.cache/lmprefs}
  local pins
  mapfile -t pins < <("$PY" -c "import sys; from importlib.metadata import version
for n in sys.argv[1:]: print(f'{n}=={version(n)}')" "${WHEELS[@]}")
  rm -rf "$KIT.tmp" && mkdir -p "$KIT.tmp/wheels" "$KIT.tmp/cache"
  "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any \
    -d "$KIT.tmp/wheels" "${pins[@]}"
  for a in "${ASSETS[@]}"; do
    [ -e "$cache/$a" ] || "$PY" -m lmprefs assets prepare "$a" >/dev/null
    cp -r "$cache/$a" "$KIT.tmp/cache/"
  done
  rm -rf "$KIT" && mv "$KIT.tmp" "$KIT"
  echo "gpu_kit: $KIT holds $(find "$KIT/wheels" -name "*.whl" | wc -l) wheels and ${#ASSETS[@]} assets, $(du -sh "$KIT" | cut -f1);" \
    "run there: bash scripts/gpu_kit.sh all   (carry: $KIT)"
}

setup() {
  [ -d "$KIT/wheels" ] || { echo "gpu_kit: no $KIT/wheels here: run 'bash scripts/gpu_kit.sh pack' first" >&2; exit 2; }
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" ||
    { echo "gpu_kit: no CUDA device in $PY's torch: these checks run on a GPU" >&2; exit 2; }
  "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --target /tmp/gpu-site \
    "$KIT"/wheels/*.whl
  # a copy, so that what the checks write never lands in the carried kit
  rm -rf /tmp/gpu-cache && cp -r "$KIT/cache" /tmp/gpu-cache
  export PYTHONPATH="/tmp/gpu-site:$PWD${PYTHONPATH:+:$PYTHONPATH}" LMPREFS_CACHE=/tmp/gpu-cache HF_HUB_OFFLINE=1
  export PYTHONUNBUFFERED=1
  OUTDIR=${OUT:-gpu-out}
  mkdir -p "$OUTDIR"
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    "$PY" -c "import sys, torch, transformers, peft; print(sys.version.split()[0], torch.__version__, \
transformers.__version__, peft.__version__, torch.cuda.get_device_name())"; } 2>&1 | tee "$OUTDIR/machine.txt" || true
}

step() {  # step NAME SECONDS COMMAND...: one check under its timeout, its output in $OUTDIR/NAME.log
  local name=$1 limit=$2 start=$SECONDS rc=0
  shift 2
  echo "== $name (at most ${limit}s): $*"
  timeout "$limit" "$@" >"$OUTDIR/$name.log" 2>&1 || rc=$?
  tail -n 25 "$OUTDIR/$name.log"
  echo "== $name: exit $rc after $((SECONDS - start))s"
}

bench() {
  step gpu_throughput 300 "$PY" benchmarks/gpu_throughput.py --json "$OUTDIR/gpu_throughput.json"
  step gpu_kernels 120 "$PY" benchmarks/gpu_kernels.py
}

tests() {
  step pytest_cuda 330 "$PY" -m pytest -q -p no:cacheprovider -m cuda tests/runtime/test_cuda.py -n 4 --dist load
  step scaling 240 "$PY" benchmarks/scaling.py --device cuda --models tiny --compile off --updates 3 \
    --json "$OUTDIR/scaling.json"
}

case "${1:-}" in
  pack) pack ;;
  bench) setup && bench ;;
  tests) setup && tests ;;
  all) setup && bench && tests ;;
  *) echo "usage: bash scripts/gpu_kit.sh pack | bench | tests | all  (got '${1:-}')" >&2; exit 2 ;;
esac
