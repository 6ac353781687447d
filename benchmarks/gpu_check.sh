#!/usr/bin/env bash
# One short GPU check (≤ 8 minutes on one H200), each section in its own process under its own time limit, the most
# wanted first, so that a slow section costs only itself:
#   6 the negatives ablation at GPU size (needs .gpu/negatives: `python benchmarks/negatives_bench.py --examples 16384
#     --pack .gpu/negatives` on a machine with the data, then carry .gpu), 1 Triton loss vs the float64 reference,
#   2 fused vs eager loss time and memory, 3 fp16/bf16 vs fp32 encoding, 5 fp16 passages/s against
#   sentence-transformers with fp16 weights, 4 a large-batch GradCache step (last: it has never finished in time).
# Uses the machine's own torch/triton/transformers/sentence-transformers and the source tree as is (the C++ index is
# not needed here).
#   bash benchmarks/gpu_check.sh RESULTS_DIR
set -uo pipefail
out=${1:?usage: gpu_check.sh RESULTS_DIR}
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
unset TRITON_INTERPRET
for spec in 6:190 1:110 2:50 3:30 5:50 4:40; do
  section=${spec%%:*} limit=${spec##*:}
  mkdir -p "$out/section$section"
  timeout "$limit" python3 benchmarks/gpu_check.py "$out/section$section" --sections "$section"
  status=$?
  [ "$status" -eq 0 ] || echo "section $section: exit $status (124: stopped at its ${limit} s limit)"
done
