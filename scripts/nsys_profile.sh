#!/usr/bin/env bash
# Profile one benchmark configuration with Nsight Systems, recording only its measured steps.
#
#   scripts/nsys_profile.sh OUTPUT_STEM [--nsys-args NSYS_OPTIONS... --] [python -m cs336_systems.benchmark flags...]
#   scripts/nsys_profile.sh results/nsys/small_naive --model-size small --context-length 512 --attention naive
#   scripts/nsys_profile.sh results/nsys/small_mem --nsys-args --pytorch=functions-trace,autograd-shapes-nvtx \
#       --cuda-memory-usage=true -- --model-size small --pass-type train-step --nvtx blocks
#
# Extra `nsys profile` options go between --nsys-args and --, or in $NSYS_ARGS (split on
# spaces; these come first); both are added after the defaults below.
#
# Runs `python -m cs336_bench.benchmark --nvtx --no-profile-step FLAGS` (ours, even from a student's
# repository root, where `cs336_systems` is theirs) under `nsys profile` with
# --capture-range=cudaProfilerApi: the benchmark calls cudaProfilerStart/Stop around its
# measured steps (nvtx.capture in time_steps), so warmup, model building and compilation
# are not recorded. Then `nsys stats` prints the NVTX range summary and the GPU kernel
# summaries and writes them as CSV beside the report:
#   OUTPUT_STEM.nsys-rep              open in the Nsight Systems GUI (timeline)
#   OUTPUT_STEM_<report>.csv          nvtx_sum, cuda_gpu_kern_sum, nvtx_kern_sum, ...
#
# nsys is taken from $NSYS, else PATH, else the usual install folders.
# $PYTHON picks the interpreter (default python3).
set -euo pipefail

prog=scripts/nsys_profile.sh
if [ $# -lt 1 ] || [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'
  [ $# -lt 1 ] && exit 2 || exit 0
fi
stem=$1
shift
extra=()
[ -n "${NSYS_ARGS:-}" ] && read -r -a extra <<<"$NSYS_ARGS"
if [ "${1:-}" = "--nsys-args" ]; then
  shift
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    extra+=("$1")
    shift
  done
  if [ $# -eq 0 ]; then
    echo "$prog: error: --nsys-args needs a closing -- before the benchmark flags" >&2
    exit 2
  fi
  shift
fi

find_nsys() {
  if [ -n "${NSYS:-}" ]; then
    [ -x "$NSYS" ] && { echo "$NSYS"; return; }
    echo "$prog: error: NSYS=$NSYS is not an executable file" >&2
    exit 2
  fi
  command -v nsys 2>/dev/null && return
  local candidate
  # Nsight Systems' own folders (its .run/.deb, the -cli package, the CUDA toolkit's copy).
  # Not Nsight Compute's: the nsys inside it cannot turn its .qdstrm into a report.
  for candidate in /usr/local/cuda/bin/nsys /usr/local/cuda-*/bin/nsys \
    /opt/nvidia/nsight-systems/*/bin/nsys /opt/nvidia/nsight-systems-cli/*/bin/nsys \
    /opt/nvidia/nsight-systems/*/target-linux-x64/nsys /opt/nvidia/nsight-systems-cli/*/target-linux-x64/nsys \
    /usr/local/cuda/nsight-systems-*/bin/nsys /usr/local/cuda-*/nsight-systems-*/bin/nsys \
    /usr/lib/nsight-systems/bin/nsys; do
    [ -x "$candidate" ] && { echo "$candidate"; return; }
  done
  echo "$prog: error: nsys not found: install Nsight Systems (https://developer.nvidia.com/nsight-systems)" \
    "or set NSYS=/path/to/nsys" >&2
  exit 2
}
nsys=$(find_nsys)
python=${PYTHON:-python3}
mkdir -p "$(dirname "$stem")"

# -t cuda,nvtx,osrt: CUDA API and kernels, our NVTX ranges, OS runtime calls (what the CPU waits on).
# --sample=none --cpuctxsw=none: no CPU sampling, which costs overhead and is not needed here.
# --capture-range-end=stop: stop recording at cudaProfilerStop, let the process finish normally.
# --cuda-graph-trace=node for --cuda-graphs rows: each kernel of a replay, not one graph box.
# --no-profile-step: the benchmark's own torch.profiler step would be a second CUPTI subscriber.
for flag in "$@"; do
  [ "$flag" = "--cuda-graphs" ] && extra=(--cuda-graph-trace=node ${extra[@]+"${extra[@]}"})
done
"$nsys" profile \
  --trace=cuda,nvtx,osrt \
  --sample=none --cpuctxsw=none \
  --capture-range=cudaProfilerApi --capture-range-end=stop \
  --force-overwrite=true --output="$stem" \
  ${extra[@]+"${extra[@]}"} \
  "$python" -m cs336_bench.benchmark --nvtx --no-profile-step "$@"

# Report names changed in nsys 2023.x (nvtxsum -> nvtx_sum, ...): try the new name, then the old.
for pair in nvtx_sum:nvtxsum cuda_gpu_kern_sum:gpukernsum nvtx_kern_sum:nvtxkernsum \
  nvtx_gpu_proj_sum:nvtxgpuproj cuda_api_sum:cudaapisum; do
  ok=
  for report in ${pair%%:*} ${pair##*:}; do
    if "$nsys" stats --force-export=true --report "$report" --format csv --output "$stem" "$stem.nsys-rep" \
      >/dev/null 2>&1; then
      echo "=== $report"
      { "$nsys" stats --report "$report" --format column "$stem.nsys-rep" 2>/dev/null || true; } | sed -n '1,40p'
      ok=1
      break
    fi
  done
  [ -n "$ok" ] || echo "=== ${pair%%:*}: not available in this nsys ($("$nsys" --version 2>/dev/null | head -1))"
done
echo "wrote $stem.nsys-rep and ${stem}_*.csv" >&2
