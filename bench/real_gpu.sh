#!/usr/bin/env bash
# On a machine with a real NVIDIA GPU: one sample of the real NVML through gpufleet, the signals
# of failures the driver hides and the call-deadline path (bench/real_gpu_hidden.py), and the
# collector benchmark against the real driver. Writes what it saw under ${OUT:-bench-out}/.
#   bash bench/real_gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench-out}"
mkdir -p "$out"
scripts/bootstrap.sh dashboard >/dev/null
nvidia-smi -q > "$out/nvidia-smi-q.txt" 2>&1 || echo "nvidia-smi failed (see $out/nvidia-smi-q.txt)"
.venv/bin/gpufleet collector probe --json > "$out/probe.json" 2> "$out/probe.stderr"
.venv/bin/gpufleet collector probe > "$out/probe.txt" 2>&1
# Failures the driver hides: each new field as the real driver answers it, and the call deadline.
.venv/bin/python bench/real_gpu_hidden.py > "$out/hidden-failures.json" 2> "$out/hidden-failures.stderr" \
  || echo "real_gpu_hidden.py failed (see $out/hidden-failures.stderr)"
.venv/bin/python bench/collector_bench.py --real --seconds 15 --json "$out/collector-bench.json" | tee "$out/collector-bench.txt"
echo "wrote $out/: probe.json, probe.txt, nvidia-smi-q.txt, hidden-failures.json, collector-bench.{txt,json}"
