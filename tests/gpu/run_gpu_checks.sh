#!/usr/bin/env bash
# The GPU checks in one go, bounded to about 9.5 minutes plus the install: the GPU tests, then
# the PPO benchmark on CUDA (batch 4096, preset high, then the Pong rows: end to end, Atari
# paths, peak memory). bench.json keeps each figure as it is measured, so a benchmark stopped
# by its time limit still returns what it had (marked "partial").
# Writes into ${OUT:-gpu_out}/. Usage, from the repo root on a GPU machine:
#   bash tests/gpu/run_gpu_checks.sh
# A machine without a package index: put the wheels of what its Python lacks (ray, gymnasium,
# ale-py, ...) in .whl/; they are installed into /tmp/site and the repo is used in place.
set -uo pipefail
out=${OUT:-gpu_out}
mkdir -p "$out"
{ nvidia-smi; lscpu | grep -E 'Model name|^CPU\(s\)'; python3 --version; } > "$out/machine.txt" 2>&1
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl > "$out/install.log" 2>&1 || { cat "$out/install.log"; exit 1; }
    export PYTHONPATH="/tmp/site:$PWD"
    export PATH="/tmp/site/bin:$PATH"
else
    python3 -m pip install -q -e '.[test]' > "$out/install.log" 2>&1
fi
python3 -c "import torch, ray, gymnasium, ale_py; print('torch', torch.__version__, 'cuda', \
torch.cuda.is_available(), 'ray', ray.__version__)" >> "$out/machine.txt" 2>&1
cat "$out/machine.txt"
timeout 240 python3 -m pytest -q -m gpu tests/gpu -s -p no:cacheprovider --durations=10 \
    > "$out/gpu_tests.txt" 2>&1
echo "gpu tests exit: $?" | tee -a "$out/gpu_tests.txt"
tail -15 "$out/gpu_tests.txt"
timeout 330 python3 -m rllib_amp.bench --quick --device cuda --algos PPO --models high \
    --json "$out/bench.json" > "$out/bench.md" 2> "$out/bench.err"
echo "bench exit: $?" | tee -a "$out/bench.md"
cat "$out/bench.md"
