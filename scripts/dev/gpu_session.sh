#!/usr/bin/env bash
# GPU checks run on a lent H100/H200 (device tool): bash scripts/dev/gpu_session.sh PART
# Results go to $OUT (or results/ when $OUT is unset); each stage has its own time limit so
# one slow stage cannot cost the others.
set -u
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
out="${OUT:-results}"
py=python3
stage() { local limit=$1; shift; echo "=== $* (limit ${limit}s)"; timeout "$limit" "$@"; echo "=== exit $?"; }

case "${1:-}" in
  core)
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
    $py -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"
    stage 330 $py -m cs336_systems.benchmark_direct --model-sizes small medium large xl 2.7B \
      --context-lengths 128 256 512 1024 --precisions fp32 bf16 --pass-types forward forward-backward \
      --output "$out/gpu_sweep_h100.csv" --output "$out/gpu_sweep_h100.md"
    stage 150 $py scripts/checks/memory_accuracy.py --device cuda --output-dir "$out/checks"
    stage 60 $py scripts/checks/bench_timing.py --device cuda --output-dir "$out/checks"
    stage 90 $py -m pytest -q -o addopts=-ra tests/test_gpu.py 2>&1 | tail -25
    ;;
  extras)
    res="$PWD/gpu_extras"; mkdir -p "$res"
    pack() { tar czf "$out/extras.tgz" -C "$res" . ; }
    $py - <<'PY'
import time, torch
x = torch.randn(1024, device="cuda"); torch.cuda.synchronize()
for name, fn in [("memory_stats", lambda: torch.cuda.memory_stats()),
                 ("max_memory_allocated", lambda: torch.cuda.max_memory_allocated()),
                 ("reset_peak_memory_stats", lambda: torch.cuda.reset_peak_memory_stats())]:
    t = time.perf_counter()
    for _ in range(1000): fn()
    print(f"{name}: {(time.perf_counter() - t) * 1e3:.1f} us per call")
PY
    stage 240 $py scripts/checks/bench_model.py --device cuda --output-dir "$res"; pack
    stage 60 $py -m cs336_systems.benchmark_direct --model-sizes small medium --context-lengths 128 512 \
      --precisions bf16 --pass-types forward forward-backward --measure-steps 20 --output "$res/gpu_noise_host.jsonl"
    stage 60 $py -m cs336_systems.benchmark_direct --model-sizes small medium --context-lengths 128 512 \
      --precisions bf16 --pass-types forward forward-backward --measure-steps 20 --timer cuda-event \
      --output "$res/gpu_noise_events.jsonl"; pack
    stage 50 $py -m cs336_systems.benchmark_direct --model-sizes small medium large xl 2.7B --context-lengths 512 \
      --precisions tf32 --pass-types forward-backward --output "$res/gpu_tf32_h100.csv"; pack
    stage 80 $py -m cs336_bench.warmup_study --device cuda --context-length 512 --output-dir "$res"; pack
    stage 80 $py -m cs336_systems.find_max --dimension batch-size --size-table 2025 --model-size xl --context-length 512 \
      --pass-type train-step --precision bf16 --start 8 --resolution 4 --output "$res/find_max_xl_h100.csv" \
      --summary "$res/find_max_xl_h100.json"; pack
    ls -la "$res"
    ;;
  sweeps)
    # about 6 minutes: the handout grid in one process (short steps to fit the budget),
    # the warmup study, the largest xl training batch (vs the estimator's 19), a report and a compare.
    stage 240 $py -m cs336_systems.benchmark_direct --model-sizes small medium large xl 2.7B \
      --context-lengths 128 256 512 1024 --precisions fp32 bf16 --pass-types forward forward-backward \
      --warmup-steps 2 --measure-steps 5 --output "$out/gpu_sweep.csv" --output "$out/gpu_sweep.jsonl"
    stage 60 $py -m cs336_bench.warmup_study --device cuda --model-size small --context-length 512 --output-dir "$out"
    $py -m cs336_systems.memory --model-size xl --context-length 512 --pass-type train-step --precision bf16 \
      --find-max batch-size --device-memory "$($py -c 'import torch; print(torch.cuda.mem_get_info()[1])')" | tail -1
    stage 150 $py -m cs336_systems.find_max --dimension batch-size --model-size xl --context-length 512 \
      --pass-type train-step --precision bf16 --start 4 --timeout 90 --output "$out/find_max_xl.csv"
    stage 30 $py -m cs336_systems.report "$out/gpu_sweep.csv" --output "$out/gpu_report/report.md"
    stage 30 $py -m cs336_systems.compare "$out/gpu_sweep.csv" "$out/gpu_sweep.jsonl" --fail-above 5
    ;;
  input)
    # monitor (NVML columns) and loader_bench (CUDA events, pinned non_blocking copies, the GPU spin stand-in)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    stage 90 $py -m pytest -q -o addopts=-ra tests/test_monitor.py tests/test_loader_bench.py -k "gpu or nvml or events or 500mb" 2>&1 | tail -15
    stage 60 $py -m cs336_systems.loader_bench --device cuda --storage simulated --latency-ms 1 --item-bytes 2MiB \
      --num-items 256 --batch-size 16 --compute-ms 15 --epochs 2 --num-workers 0 4 --pin-memory false true \
      --output "$out/loader_gpu.csv" --output "$out/loader_gpu.md" --monitor "$out/loader_gpu_monitor.csv" --monitor-interval 0.2
    stage 60 $py -m cs336_systems.monitor --interval 0.2 --output "$out/monitor_gpu_benchmark.csv" -- \
      $py -m cs336_systems.benchmark --model-size small --context-length 512 --device cuda --warmup-steps 3 --measure-steps 40
    ;;
  attention)
    # attention and mixed precision: about 3.5 minutes on an H100 (the 16384-long naive/compiled rows dominate;
    # --max-seconds 5 bounds each timed loop).
    stage 60 $py -m cs336_systems.mixed_precision --device cuda | tee "$out/mixed_precision_cuda.txt"
    stage 120 $py -m pytest -q -o addopts=-ra tests/test_attention_gpu.py tests/test_nvtx.py 2>&1 | tail -15
    stage 240 $py -m cs336_systems.attention_bench --device cuda --head-dims 16 128 --seq-lens 256 1024 4096 16384 \
      --batch-size 8 --steps 100 --max-seconds 5 --implementations naive sdpa compiled \
      --output "$out/attention_h100.csv" --output "$out/attention_h100.md" --output "$out/attention_h100.jsonl"
    ;;
  first)
    shift; exec $py scripts/dev/gpu_first.py "$@" ;;
  *) echo "usage: $0 first [--dry-run|--collect DIR]|core|extras|sweeps|input|attention" >&2; exit 2 ;;
esac
