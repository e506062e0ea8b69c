#!/usr/bin/env bash
# The GPU checks in one go, bounded to 7 minutes plus the install: the GPU tests, then the
# PPO benchmark on CUDA (the GPU targets: batch 4096, presets full and high).
# Writes into ${OUT:-gpu_out}/. Usage, from the repo root on a GPU machine:
#   bash tests/gpu/run_gpu_checks.sh
set -uo pipefail
out=${OUT:-gpu_out}
mkdir -p "$out"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
python -m pip install -q -e '.[test]' > "$out/install.log" 2>&1
timeout 150 python -m pytest -q -m gpu tests/gpu -s > "$out/gpu_tests.txt" 2>&1
echo "gpu tests exit: $?" | tee -a "$out/gpu_tests.txt"
timeout 270 python -m rllib_amp.bench --quick --device cuda --algos PPO --models full,high \
    --json "$out/bench.json" > "$out/bench.md" 2> "$out/bench.err"
echo "bench exit: $?" | tee -a "$out/bench.md"
cat "$out/bench.md"
