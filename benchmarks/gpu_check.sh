#!/usr/bin/env bash
# The GPU checks and benchmarks recorded in docs/gpu.md, as one script for a short GPU slot (< 8 min on one H200).
#
#   HOTLOOP_RAW_ROOT=<dir with ptb/ and multi30k/> bash benchmarks/gpu_check.sh            # cuda, JSON in docs/data/gpu_check
#   bash benchmarks/gpu_check.sh --device cpu --dry-run [--out DIR]                     # the same parts, tiny (CI)
#   python benchmarks/gpu_report.py docs/data/gpu_check > docs/gpu.md                   # re-make docs/gpu.md
#
# docs/data/gpu_check/notes.md (hand-written, appended to docs/gpu.md) reads the numbers of the run
# kept there: rewrite it when a new run replaces that folder's JSON.
#
# Each part has its own time limit and a failing part does not stop the next one; every part writes
# JSON into OUT (docs/data/gpu_check by default; a temporary folder for --dry-run):
#   machine.json      the GPU (or CPU), torch, driver;
#   tests.json        the CUDA tests (pytest's junit XML summarised; skipped cases named);
#   step_gap.json     benchmarks/step_gap.py: hotloop's step against the expert's at the same settings;
#   zoo_full.json     benchmarks/zoo.py --size full: naive, expert, expert + torch.compile, hotloop auto;
#   default.json      the default `hotloop train` (steps, wall time, final valid metrics);
#   fsdp.json         one FSDP run (world size 1 exercises the NCCL/CUDA path), when data_parallel=fsdp exists;
#   parts.json        each part's exit code and seconds.
set -u -o pipefail
DEVICE=cuda
DRY=0
OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE="$2"; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    --out) OUT="$2"; shift 2 ;;
    *) echo "gpu_check.sh: unknown argument $1 (use --device cpu|cuda, --dry-run, --out DIR)" >&2; exit 2 ;;
  esac
done
if [ -z "$OUT" ]; then
  if [ "$DRY" = 1 ]; then OUT="$(mktemp -d)"; else OUT=docs/data/gpu_check; fi
fi
mkdir -p "$OUT/logs"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
PARTS="$OUT/parts.jsonl"
: > "$PARTS"

# part NAME LIMIT_S CMD...: run CMD under a time limit, log it, record its exit code and seconds
part() {
  local name="$1" limit="$2"; shift 2
  echo; echo "=== $name ($(date +%T), limit ${limit}s)"
  local start=$SECONDS
  timeout --kill-after 10 "$limit" "$@" > "$OUT/logs/$name.log" 2>&1
  local rc=$?
  tail -n 12 "$OUT/logs/$name.log"
  echo "{\"part\": \"$name\", \"rc\": $rc, \"seconds\": $((SECONDS - start)), \"limit\": $limit}" >> "$PARTS"
}

if [ "$DRY" = 1 ]; then
  ZOO_ARGS=(--size small --smoke --models se_resnext50)
  TEST_FILES=(tests/engine/test_engine_cuda.py)
  DEFAULT_ARGS=(--max-steps 10 --strategy default)
  FSDP_STEPS=5
  GAP_ARGS=(--smoke --models bert --fed)
  LIMITS=(60 180 120 120 90)
else
  # the rows docs/data/gpu_check/zoo_full.json lacks first (the JSON keeps each finished row); tuning
  # capped at 10 s with or without a compile candidate; the compiled expert on bert only (compiling
  # the expert took 44 s for bert, 81 s for transformer_base and 56 s for se_resnext50 on the H200)
  ZOO_ARGS=(--size full --models se_resnext50,deeplabv3plus,yolov3,mask_rcnn,cyclegan,bert,transformer_base
            --compile --compile-models bert --rounds 2 --block 6
            --tune-seconds 10 --compile-tune-seconds 10)
  TEST_FILES=(tests/engine/test_engine_cuda.py tests/ops tests/data/test_data_prefetch.py)
  DEFAULT_ARGS=(--max-steps 600)
  FSDP_STEPS=20
  GAP_ARGS=(--size full --models bert,transformer_base --sdpa --one-shape --fed --rounds 3 --block 6)
  LIMITS=(110 250 40 30 75)
fi

part machine 30 "$PY" benchmarks/gpu_report.py --machine "$DEVICE" --json "$OUT/machine.json"
part cuda_tests "${LIMITS[0]}" "$PY" -m pytest -q -p no:cacheprovider -rs "${TEST_FILES[@]}" \
  --junitxml "$WORK/tests.xml"
"$PY" benchmarks/gpu_report.py --junit "$WORK/tests.xml" --json "$OUT/tests.json" || true
part step_gap "${LIMITS[4]}" "$PY" benchmarks/step_gap.py --device "$DEVICE" "${GAP_ARGS[@]}" --json "$OUT/step_gap.json"
part zoo "${LIMITS[1]}" "$PY" benchmarks/zoo.py --device "$DEVICE" "${ZOO_ARGS[@]}" --json "$OUT/zoo_full.json"
part default_train "${LIMITS[2]}" "$PY" -m hotloop train --device "$DEVICE" --output-dir "$WORK/default" \
  "${DEFAULT_ARGS[@]}"
"$PY" benchmarks/gpu_report.py --run-dir "$WORK/default" --json "$OUT/default.json" || true
if "$PY" -c "from hotloop.engine.strategy import Strategy; Strategy(data_parallel='fsdp').validate()" 2>/dev/null; then
  part fsdp "${LIMITS[3]}" "$PY" -m hotloop train --device "$DEVICE" --nproc 1 --output-dir "$WORK/fsdp" \
    --max-steps "$FSDP_STEPS" --strategy default --strategy-override data_parallel=fsdp
  "$PY" benchmarks/gpu_report.py --run-dir "$WORK/fsdp" --json "$OUT/fsdp.json" || true
fi
"$PY" -c "import json,sys; rows=[json.loads(l) for l in open(sys.argv[1])]; json.dump(rows, open(sys.argv[2], 'w'), indent=2)" \
  "$PARTS" "$OUT/parts.json" && rm -f "$PARTS"
echo; echo "=== done: JSON in $OUT (python benchmarks/gpu_report.py $OUT re-makes docs/gpu.md)"
