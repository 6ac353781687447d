#!/usr/bin/env bash
# One short GPU check, at most 8 minutes on one H100 or H200 (the section limits below add up to 460 s): each section
# in its own process under its own time limit, writing its rows as it goes (OUT/<section>.jsonl and .md), so a slow
# section costs only itself; OUT/gpu.md gathers them at the end.
#   correctness (95 s)  the Triton loss against the float64 reference (cheap, first)
#   loss        (90 s)  fused vs eager forward + backward, bf16, d = 768, B = 1,024 … 65,536: time, peak memory,
#                       TFLOP/s beside the card's dense bf16 peak
#   gradcache  (215 s)  one GradCache step of fastdpr against sentence-transformers' CachedMultipleNegativesRankingLoss,
#                       MiniLM and a BERT-base-shaped model, batches 4,096 and 16,384, then the largest batch in time
#   encoding    (60 s)  passage encoding fp16/bf16, and fastdpr against sentence-transformers
# The negatives ablation (`--sections negatives`) is not in the default run: it needs a .gpu/negatives pack made on
# a machine with the data, which is not carried.
# Uses the machine's own torch/triton/transformers/sentence-transformers and the source tree as is (the C++ index is
# not needed).
#   bash benchmarks/gpu_check.sh OUT
#   GPU_CHECK_QUICK=1 bash benchmarks/gpu_check.sh OUT    # every section on the CPU at toy sizes: a code check
# PYTHON names the interpreter (default python3).
set -uo pipefail
out=${1:?usage: gpu_check.sh OUT}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
quick=() stretch=1
if [ "${GPU_CHECK_QUICK:-0}" = 1 ]; then
  quick=(--quick) stretch=3  # a busy CPU runs the toy sizes slower than the GPU the real ones
  export TRITON_INTERPRET=1  # the kernels run in the interpreter on CPU tensors
else
  unset TRITON_INTERPRET
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
fi
failed=0
for spec in correctness:95 loss:90 gradcache:215 encoding:60; do
  section=${spec%%:*} limit=$((${spec##*:} * stretch))
  start=$SECONDS
  timeout "$limit" "$py" benchmarks/gpu_check.py "$out" --sections "$section" "${quick[@]}"
  status=$?
  echo "section $section: exit $status after $((SECONDS - start)) s (124: stopped at its ${limit} s limit)"
  [ "$status" -eq 0 ] || failed=1
done
"$py" benchmarks/gpu_check.py "$out" --report "${quick[@]}" > /dev/null
echo "results: $out/gpu.md"
exit $failed
