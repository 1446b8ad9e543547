#!/usr/bin/env bash
# The CUDA checks and benchmarks recorded in docs/gpu.md, as one script for a GPU machine.
#
#   OUT=out_gpu HOTLOOP_RAW_ROOT=<dir with ptb/ and multi30k/> bash benchmarks/gpu_check.sh
#
# Each part has its own time limit and a failing part does not stop the next one:
#   1. the CUDA tests (engine parity per model and strategy, resume, decoding, detection ops, prefetch);
#   2. benchmarks/zoo.py --device cuda (plain loop against hotloop's auto, interleaved);
#   3. the default `hotloop train` on cuda;
#   4. transformer_multi30k trained for MT_SECONDS on cuda, then test2016 BLEU (greedy).
set -u -o pipefail
OUT=${OUT:-out_gpu}
MT_SECONDS=${MT_SECONDS:-80}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

section() { echo; echo "=== $1 ($(date +%T))"; }

section machine
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(), 'bf16', torch.cuda.is_bf16_supported())"
  lscpu | grep 'Model name'; nproc; } 2>&1 | tee "$OUT/machine.txt"

section "CUDA tests"
timeout 130 python3 -m pytest -q -p no:cacheprovider -n 6 -rs tests/engine/test_engine_cuda.py tests/ops \
  tests/data/test_data_prefetch.py 2>&1 | tee "$OUT/tests.log" | tail -40

section "zoo on cuda"
timeout 220 python3 benchmarks/zoo.py --device cuda --rounds 5 --block 20 --tune-seconds 15 \
  --json "$OUT/zoo_cuda.json" 2>&1 | tee "$OUT/zoo.log" | grep -v Warning

section "default hotloop train on cuda"
timeout 45 python3 -m hotloop train --device cuda --output-dir /tmp/hl_default --max-steps 600 2>&1 \
  | tee "$OUT/default.log" | tail -8

section "transformer_multi30k on cuda for ${MT_SECONDS} s"
timeout $((MT_SECONDS + 40)) python3 -m hotloop train --device cuda --problem translate_multi30k_de_en \
  --hparams transformer_multi30k --output-dir /tmp/hl_mt --max-time "$MT_SECONDS" 2>&1 \
  | tee "$OUT/mt_train.log" | tail -6
timeout 45 python3 -m hotloop eval --device cuda --output-dir /tmp/hl_mt --splits test --metrics bleu 2>&1 \
  | tee "$OUT/mt_eval.log" | tail -6
section done
