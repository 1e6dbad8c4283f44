"""First contact with a lent GPU: one call of at most 8 minutes, five stages in order of value.

    bash scripts/dev/gpu_session.sh first                 # on the GPU: archives and a log under $OUT
    bash scripts/dev/gpu_session.sh first --dry-run       # the same stages, tiny shapes, on this CPU
    bash scripts/dev/gpu_session.sh first --collect DIR   # here: DIR's archives -> results/gpu/<gpu>/

Each stage runs its commands, each under its own limit and the stage's, and packs what it wrote
into $OUT/<n>-<stage>.tgz as soon as it ends, so a call cut short still returns the stages it
finished. The dry run is the same plan with tiny shapes, the CPU's timer and gloo in place of NCCL;
CI runs it, so a renamed flag fails here and not in the next GPU lease. The exit status is 1 when a
command failed or ran out of time, 0 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STUDENT_REPO = REPO / "tests" / "fixtures" / "student_repo"  # a 2026 solution's layout: flash, DDP, FSDP
CALL_LIMIT_S = 480  # one device call of at most 8 minutes (the lease is 15, start-up included)
PY = sys.executable


@dataclasses.dataclass(frozen=True)
class Command:
    label: str
    argv: list[str]
    limit_s: int
    cwd: Path = REPO
    log: str | None = None  # write its stdout and stderr to this file of the stage directory too


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    limit_s: int
    commands: list[Command]
    about: str


def tool(name: str, *args: str) -> list[str]:
    """A cs336-bench tool as a student runs it (python -m cs336_bench TOOL works from their root too)."""
    return [PY, "-m", "cs336_bench", name, *args]


def fast_micro_batch(device_memory_bytes: int | None) -> int:
    """The 2.7B fast path's micro-batch: 8 sequences where the estimator says they fit (larger
    matmuls, the optimizer amortised over twice the tokens), else 4 (an H100 80GB)."""
    from cs336_systems.config import BenchmarkConfig
    from cs336_systems.memory.estimate import estimate_config
    from cs336_systems.models import ModelConfig

    model = ModelConfig.from_size("2.7B", "2025", context_length=512, fused_projections=True)
    for batch in (8, 4):
        config = BenchmarkConfig(
            model=model,
            context_length=512,
            batch_size=batch,
            pass_type="train-step",
            precision="bf16",
            grad_accum_steps=4,
            param_dtype="bf16",
            device="cuda",
        )
        if device_memory_bytes and estimate_config(config, "cuda").total_bytes <= 0.95 * device_memory_bytes:
            return batch
    return 4


def plan(work: Path, dry_run: bool, student_repos: list[Path], device_memory_bytes: int | None = None) -> list[Stage]:
    """The stages in order of value. `dry_run`: tiny shapes on the CPU, the same tools and flags otherwise."""
    gpu = not dry_run
    device = ["--device", "cuda" if gpu else "cpu"]
    timer = ["--timer", "cuda-event" if gpu else "host"]
    backend = ["--backend", "nccl" if gpu else "gloo"]
    # 2025's table: small..2.7B (the 2026 xl is the 2025 2.7B); a dry run keeps the names, tiny shapes
    tiny = ["--d-model", "64", "--d-ff", "128", "--num-layers", "2", "--num-heads", "2", "--vocab-size", "97"]
    shape = ["--size-table", "2025", *([] if gpu else tiny)]
    context = "512" if gpu else "32"
    sizes = ["small", "medium", "large", "xl", "2.7B"] if gpu else ["small", "medium"]
    big = "2.7B" if gpu else "small"
    steps = ["--warmup-steps", "5", "--measure-steps", "10"] if gpu else ["--warmup-steps", "1", "--measure-steps", "2"]
    peak = [] if gpu else ["--peak-tflops", "1"]  # a CPU row needs no matmul probe here
    compiled = ["--compile", "on", "--compile-scope", "blocks", "--fused-projections"]

    def sweep(out: str, batch: str, *args: str) -> list[str]:
        path = work / out
        return tool(
            "benchmark_direct",
            *shape,
            *device,
            *timer,
            *steps,
            *peak,
            "--context-lengths",
            context,
            "--batch-sizes",
            batch,
            *args,
            "--output",
            f"{path}.csv",
            "--output",
            f"{path}.jsonl",
        )

    def out(name: str) -> str:
        return str(work / name)

    environment = Stage(
        "environment",
        100,
        [
            Command("versions", [PY, str(Path(__file__)), "--versions", out("environment/versions.json")], 20),
            Command(
                "gpu_selfcheck",
                [
                    PY,
                    "scripts/checks/gpu_selfcheck.py",
                    *device,
                    "--output",
                    out("environment/gpu_selfcheck.md"),
                    *([] if gpu else ["--no-compile"]),
                ],
                40,
            ),
            Command(
                "gpu tests",
                [
                    PY,
                    "-m",
                    "pytest",
                    "-q",
                    "-p",
                    "no:cacheprovider",
                    "-o",
                    "addopts=-ra",  # one process: a bare GPU machine may lack pytest-xdist (pyproject's -n 2)
                    "tests/test_gpu.py",
                    "tests/test_gpu_cuda_graphs.py",
                    "tests/test_gpu_fast_path.py",
                    "tests/test_attention_gpu.py",
                    "--junitxml",
                    out("environment/gpu_tests.xml"),
                ],
                70,
                log="gpu_tests.txt",
            ),
        ],
        "GPU, driver, torch, CUDA, Triton; the self-check; the GPU-only tests",
    )

    micro = str(fast_micro_batch(device_memory_bytes)) if gpu else "4"  # the dry run has both rows too
    small_batch = "4" if gpu else "2"
    train = ["--model-sizes", big, "--pass-types", "train-step", "--precisions", "bf16"]
    fast = [*train, *compiled, "--param-dtype", "bf16"]
    fast_commands = [
        Command(
            f"best: {micro} x 4 micro-batches",
            sweep(f"fast_path/best_b{micro}_accum4", micro, *fast, "--grad-accum-steps", "4"),
            45,
        ),
        Command("eager beside it", sweep("fast_path/eager", small_batch, *train), 30),
        Command(
            f"best: {small_batch} x 2 micro-batches",
            sweep("fast_path/best_accum2", small_batch, *fast, "--grad-accum-steps", "2"),
            30,
        ),
    ]
    if micro != small_batch:  # the 4 x 4 row too, the H100's configuration
        fast_commands.insert(
            1,
            Command(
                f"best: {small_batch} x 4 micro-batches",
                sweep(f"fast_path/best_b{small_batch}_accum4", small_batch, *fast, "--grad-accum-steps", "4"),
                35,
            ),
        )
    fast_path = Stage(
        "fast_path",
        110,
        fast_commands,
        f"{big} bf16 train step: compiled blocks, bf16 parameters, fused projections, "
        "gradient accumulation (>= 4,096 tokens per optimizer step); eager beside it",
    )

    per_size = ["--model-sizes", *sizes, "--pass-types", "forward-backward", "--no-profile-step"]
    best_path = Stage(
        "precision",
        105,
        [
            # what the targets need first (bf16 against fp32 on the best path), tf32 last
            Command(
                "best bf16",
                sweep(
                    "precision/best_bf16",
                    small_batch,
                    *per_size,
                    *compiled,
                    "--precisions",
                    "bf16",
                    "--param-dtype",
                    "bf16",
                ),
                105,
            ),
            Command(
                "best fp32",
                sweep("precision/best_fp32", small_batch, *per_size, *compiled, "--precisions", "fp32"),
                105,
            ),
            Command(
                "best tf32",
                sweep("precision/best_tf32", small_batch, *per_size, *compiled, "--precisions", "tf32"),
                105,
            ),
        ],
        f"forward-backward at context {context}, {sizes[0]}..{sizes[-1]}, bf16 / fp32 / tf32, the best path",
    )
    eager = Stage(
        "precision_eager",
        60,
        [
            Command(
                "eager bf16 fp32",
                sweep("precision_eager/eager", small_batch, *per_size, "--precisions", "bf16", "fp32"),
                60,
            ),
            Command(
                "eager tf32", sweep("precision_eager/eager_tf32", small_batch, *per_size, "--precisions", "tf32"), 60
            ),
        ],
        "the same grid, eager (the handout's model as it is)",
    )

    lengths = ["1024", "4096", "16384"] if gpu else ["64", "128"]
    attention_commands = []
    for repo in [STUDENT_REPO, *student_repos]:
        # from the student's root, as a student runs it: their flash through their tests/adapters.py
        name = "fixture" if repo == STUDENT_REPO else repo.name
        attention_commands.append(
            Command(
                f"attention_bench ({name})",
                tool(
                    "attention_bench",
                    *device,
                    "--timer",
                    "do-bench" if gpu else "host",
                    "--adapters",
                    "tests/adapters.py",
                    "--layout",
                    "bsd",
                    "--batch-size",
                    "1",
                    "--head-dims",
                    "64",
                    "--context-lengths",
                    *lengths,
                    "--precisions",
                    "bf16",
                    "--implementations",
                    "sdpa",
                    "flash-triton",
                    "flash-pytorch",
                    "naive",
                    *(["compiled"] if repo == STUDENT_REPO else []),
                    "--max-seconds",
                    "2",
                    *(["--measure-steps", "3", "--warmup-steps", "1"] if dry_run else []),
                    "--output",
                    out(f"attention/{name}.csv"),
                    "--output",
                    out(f"attention/{name}.jsonl"),
                    "--plot",
                    out(f"attention/{name}.png"),
                ),
                48,
                cwd=repo.resolve(),
            )
        )
    attention = Stage(
        "attention",
        50 + 35 * len(student_repos),
        attention_commands,
        "naive, sdpa, compiled and a student's FlashAttention-2 (PyTorch and Triton), do_bench",
    )

    monitored = tool(
        "benchmark",
        *shape,
        *device,
        *peak,
        "--model-size",
        "small",
        "--context-length",
        context,
        "--batch-size",
        small_batch,
        "--pass-type",
        "train-step",
        "--warmup-steps",
        "3",
        "--measure-steps",
        "30" if gpu else "3",
        "--no-profile-step",
        "--output",
        out("distributed/monitored_step.csv"),
    )
    distributed = Stage(
        "distributed",
        55,
        [
            Command(
                "all-reduce",
                tool(
                    "allreduce_bench",
                    *backend,
                    *device,
                    "--world-sizes",
                    "1",
                    "--sizes",
                    *(["1MB", "100MB", "1GB"] if gpu else ["1MB"]),
                    *([] if gpu else ["--measure-steps", "3"]),
                    "--output",
                    out("distributed/allreduce.csv"),
                    "--output",
                    out("distributed/allreduce.jsonl"),
                ),
                20,
            ),
            Command(
                "ddp strategies",
                tool(
                    "ddp_bench",
                    *backend,
                    *device,
                    "--world-sizes",
                    "1",
                    "--strategies",
                    "ddp",
                    "naive",
                    "flat",
                    "zero1",
                    "fsdp2",
                    *shape,
                    "--model-size",
                    "small",
                    "--context-length",
                    context,
                    "--batch-size",
                    small_batch,
                    "--precision",
                    "bf16",
                    "--warmup-steps",
                    "2",
                    "--measure-steps",
                    "5" if gpu else "2",
                    "--output",
                    out("distributed/ddp.csv"),
                    "--output",
                    out("distributed/ddp.jsonl"),
                ),
                30,
            ),
            Command(
                "monitor around a train step",
                tool("monitor", "--interval", "0.2", "--output", out("distributed/monitor.csv"), "--", *monitored),
                25,
            ),
        ],
        "NCCL all-reduce and ddp_bench's strategies at world size 1; monitor around a train step",
    )
    return [environment, fast_path, best_path, attention, distributed, eager]


STAGES = ("environment", "fast_path", "precision", "attention", "distributed", "precision_eager")


def write_versions(path: Path) -> None:
    """The machine as the first line of evidence: GPU, driver, torch, CUDA, Triton."""
    import torch

    info = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_bytes=props.total_memory, multiprocessors=props.multi_processor_count)
    if shutil.which("nvidia-smi"):
        query = "name,memory.total,driver_version,clocks.sm,clocks.max.sm,power.limit,temperature.gpu"
        smi = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv"], capture_output=True, text=True)
        info["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info, indent=1) + "\n")
    print(json.dumps(info, indent=1))


def run_command(command: Command, limit_s: float, stage_dir: Path, log) -> str:
    """Run one command in its own process group under `limit_s`; 'ok', 'failed (rc N)' or 'timeout'.
    Its output is copied as it comes (a thread reads the pipe), so a command killed at its limit
    still leaves what it printed."""
    print(f"$ (cd {command.cwd.relative_to(REPO)}) {shlex.join(command.argv)}", file=log, flush=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "PYTHONUNBUFFERED": "1",
    }
    started = time.monotonic()
    process = subprocess.Popen(
        command.argv, cwd=command.cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    sinks = [log] + ([open(stage_dir / command.log, "w")] if command.log else [])  # noqa: SIM115

    def pump() -> None:
        for chunk in iter(lambda: os.read(process.stdout.fileno(), 65536), b""):
            text = chunk.decode(errors="replace")
            for sink in sinks:
                sink.write(text)
                sink.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        rc = process.wait(timeout=limit_s)
        status = "ok" if rc == 0 else f"failed (rc {rc})"
    except subprocess.TimeoutExpired:
        status = "timeout"
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, None)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, sig)
            try:
                process.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
    reader.join(timeout=5)
    for sink in sinks[1:]:
        sink.close()
    print(
        f"=== {command.label}: {status} in {time.monotonic() - started:.0f} s (limit {limit_s:.0f} s)",
        file=log,
        flush=True,
    )
    return status


class Tee:
    """Lines to the terminal (the device reply's tail) and to the log file under $OUT."""

    def __init__(self, path: Path):
        self.file = open(path, "a")  # noqa: SIM115  the run's whole life

    def write(self, text: str) -> None:
        sys.stdout.write(text)
        self.file.write(text)

    def flush(self) -> None:
        sys.stdout.flush()
        self.file.flush()


def device_memory() -> int | None:
    import torch

    return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None


def run(out: Path, dry_run: bool, stages_wanted: list[str], student_repos: list[Path], limit_s: int) -> int:
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpu-first-"))
    log = Tee(out / "first.log")
    stages = [stage for stage in plan(work, dry_run, student_repos, device_memory()) if stage.name in stages_wanted]
    commit = (
        os.environ.get("CS336_SYSTEMS_GIT_COMMIT")
        or subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    )
    started = time.monotonic()
    summary = []
    for stage in stages:
        number = STAGES.index(stage.name) + 1
        stage_dir = work / stage.name
        stage_dir.mkdir(parents=True, exist_ok=True)
        print(f"=== stage {number} {stage.name} (limit {stage.limit_s} s): {stage.about}", file=log, flush=True)
        stage_started = time.monotonic()
        statuses = []
        for command in stage.commands:
            left = min(stage.limit_s - (time.monotonic() - stage_started), limit_s - (time.monotonic() - started))
            if left < 5:
                statuses.append((command.label, "not run (time limit)"))
                print(f"=== {command.label}: not run, the time is spent", file=log, flush=True)
                continue
            statuses.append((command.label, run_command(command, min(command.limit_s, left), stage_dir, log)))
        seconds = time.monotonic() - stage_started
        provenance = {
            "stage": stage.name,
            "commit": commit,
            "dry_run": dry_run,
            "seconds": round(seconds, 1),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "commands": [
                {"label": c.label, "status": s, "command": shlex.join(c.argv)}
                for c, (_, s) in zip(stage.commands, statuses)
            ],
        }
        (stage_dir / "run.json").write_text(json.dumps(provenance, indent=1) + "\n")
        with tarfile.open(out / f"{number}-{stage.name}.tgz", "w:gz") as archive:
            archive.add(stage_dir, arcname=stage.name)
        summary.append((stage.name, seconds, statuses))
    print("\n=== first contact: stage, seconds, commands", file=log)
    failed = False
    for name, seconds, statuses in summary:
        line = "; ".join(f"{label}: {status}" for label, status in statuses)
        print(f"{name:15s} {seconds:5.0f} s  {line}", file=log)
        failed |= any(status != "ok" for _, status in statuses)
    print(f"total {time.monotonic() - started:.0f} s; archives in {out}", file=log, flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_session.sh first", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU: every stage, every flag")
    parser.add_argument("--out", type=Path, help="where the archives go (default $OUT, else a temporary folder)")
    parser.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES), help="run only these")
    parser.add_argument(
        "--student-repo",
        type=Path,
        action="append",
        default=[],
        metavar="PATH",
        help="also time this student repository's FlashAttention-2 (from its root)",
    )
    parser.add_argument("--limit", type=int, default=CALL_LIMIT_S, help=f"seconds for all stages ({CALL_LIMIT_S})")
    parser.add_argument(
        "--collect",
        type=Path,
        nargs="+",
        metavar="DIR",
        help="here, after the call: the archives in DIR (later DIRs win) -> results/gpu/<gpu>/",
    )
    parser.add_argument("--versions", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.versions:
        write_versions(args.versions)
        return 0
    if args.collect:
        from gpu_collect import collect  # beside this file

        return collect(args.collect)
    for repo in args.student_repo:
        if not (repo / "tests" / "adapters.py").is_file():
            parser.error(f"--student-repo {repo}: no tests/adapters.py there")
    out = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else Path(tempfile.mkdtemp(prefix="first-")))
    return run(out, args.dry_run, args.stages, args.student_repo, args.limit)


if __name__ == "__main__":
    sys.exit(main())
