"""The prepared GPU call: one call of at most CALL_LIMIT_S seconds, five stages in order of value.

    bash scripts/dev/gpu_session.sh first                 # on the GPU: archives and a log under $OUT
    bash scripts/dev/gpu_session.sh first --dry-run       # the same stages, tiny shapes, on this CPU
    bash scripts/dev/gpu_session.sh first --collect DIR   # here: DIR's archives -> results/gpu/<gpu>/

Through the device tool, ask for an H100 (kind nvidia-h100-x1) with a timeout of about CALL_LIMIT_S
+ 60: a bare machine's start-up, this call and one re-run of it (`--stages` of those cut short) fit
the 15-minute lease. A public student's repository brought here (fetch) and carried in the working
tree adds its FlashAttention-2 at the leaderboard's shape: `first --student-repo PATH`.

Each stage runs its commands, each under its own limit and the stage's, and packs what it wrote
into $OUT/<n>-<stage>.tgz as soon as it ends, so a call cut short still returns the stages it
finished. The dry run is the same plan with tiny shapes and the CPU's timer, each limit
DRY_RUN_SLACK times longer and all of it within DRY_RUN_LIMIT_S; CI runs it, so a renamed flag fails
here and not in the next GPU lease (a command the CPU refuses by design, such as a CUDA memory
snapshot, counts when it is refused with its documented reason, which it gives after its flags
parse). The exit status is 1 when a command failed or ran out of time, 0 otherwise.
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
LEASE_S, START_UP_S = 900, 180  # 15 minutes of device time in all; a bare machine takes about 3 to start
CALL_LIMIT_S = 350  # start-up, this call and one re-run of it fit the lease
DRY_RUN_LIMIT_S = 280  # CI's dry run: within 5 minutes on a loaded 2-core machine
DRY_RUN_SLACK = 3  # a CPU under load compiles slower than a GPU runs: each dry-run limit is this many times longer
PY = sys.executable


@dataclasses.dataclass(frozen=True)
class Command:
    label: str
    argv: list[str]
    limit_s: int
    cwd: Path = REPO
    log: str | None = None  # write its stdout and stderr to this file of the stage directory too
    cpu_refusal: str | None = None  # a dry run: the CPU refuses it (exit 2) with this text once its flags parse


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
    # 2025's table: small..2.7B (the 2026 xl is the 2025 2.7B); a dry run keeps the names, tiny shapes
    tiny = ["--d-model", "64", "--d-ff", "128", "--num-layers", "2", "--num-heads", "2", "--vocab-size", "97"]
    shape = ["--size-table", "2025", *([] if gpu else tiny)]
    context = "512" if gpu else "32"
    sizes = ["small", "medium", "large", "xl", "2.7B"] if gpu else ["small"]
    big = "2.7B" if gpu else "small"
    # compiled rows: 10+ measured steps (CV is judged there); eager per-size rows: fewer, they are slow
    steps = ["--warmup-steps", "3", "--measure-steps", "10"] if gpu else ["--warmup-steps", "1", "--measure-steps", "2"]
    few = ["--warmup-steps", "2", "--measure-steps", "5"] if gpu else ["--warmup-steps", "1", "--measure-steps", "2"]
    peak = [] if gpu else ["--peak-tflops", "1"]  # a CPU row needs no matmul probe here
    compiled = ["--compile", "on", "--compile-scope", "blocks", "--fused-projections"]

    def out(name: str) -> str:
        return str(work / name)

    def sweep(name: str, batch: str, *args: str, counts: list[str] = steps) -> list[str]:
        return tool(
            "benchmark_direct",
            *shape,
            *device,
            *timer,
            *counts,
            *peak,
            "--context-lengths",
            context,
            "--batch-sizes",
            batch,
            *args,
            "--output",
            out(f"{name}.csv"),
            "--output",
            out(f"{name}.jsonl"),
        )

    environment = Stage(
        "environment",
        40,
        [
            Command("versions", [PY, str(Path(__file__)), "--versions", out("environment/versions.json")], 10),
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
                30,
            ),
        ],
        "GPU, driver, torch, CUDA, Triton; the self-check (the matmul probe at >= 50% of the spec sheet)",
    )

    # The 2.7B bf16 training step. Accumulating 16 micro-batches spreads the optimizer step (44 ms of
    # the first contact's 650 ms 8 x 4 step) over four times the tokens: the lever towards 55% MFU.
    micro = str(fast_micro_batch(device_memory_bytes)) if gpu else "2"
    small_batch = "4" if gpu else "2"  # the dry run's rows share one shape: one compile, cached after
    many = "16" if gpu else "3"  # micro-batches of the long step: 16 on the GPU, a dry run's CPU does 3
    train = ["--model-sizes", big, "--pass-types", "train-step", "--precisions", "bf16"]
    fast = [*train, *compiled, "--param-dtype", "bf16"]
    fast_path = Stage(
        "fast_path",
        115,
        [
            Command(
                f"best: {micro} x {many} micro-batches",
                sweep(f"fast_path/best_b{micro}_accum{many}", micro, *fast, "--grad-accum-steps", many),
                55,
            ),
            Command(
                f"best: {small_batch} x 4 micro-batches",
                sweep(f"fast_path/best_b{small_batch}_accum4", small_batch, *fast, "--grad-accum-steps", "4"),
                35,
            ),
            Command("eager beside it", sweep("fast_path/eager", small_batch, *train, counts=few), 25),
        ],
        f"{big} bf16 train step: compiled blocks, bf16 parameters, fused projections, "
        "gradient accumulation (16 and 4 micro-batches); eager beside it",
    )

    gpu_tests = Stage(
        "gpu_tests",
        90,
        [
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
                    *GPU_TEST_FILES,
                    "--junitxml",
                    out("gpu_tests/gpu_tests.xml"),
                ],
                90,
                log="gpu_tests.txt",
            )
        ],
        "the GPU-only test files, whole: CUDA graphs, do_bench, the peak probe, a real OOM",
    )

    per_size = ["--model-sizes", *sizes, "--pass-types", "forward-backward", "--no-profile-step"]
    eager_sizes = ["--model-sizes", *(sizes[-2:] if gpu else sizes), "--pass-types", "forward-backward"]
    precision = Stage(
        "precision",
        55,
        [
            Command(
                "best tf32",
                sweep("precision/best_tf32", small_batch, *per_size, *compiled, "--precisions", "tf32"),
                30,
            ),
            Command(
                f"eager {' '.join(eager_sizes[1:-2])} bf16 tf32",
                sweep(
                    "precision/eager_large",
                    small_batch,
                    *eager_sizes,
                    "--no-profile-step",
                    "--precisions",
                    "bf16",
                    "tf32",
                    counts=few,
                ),
                25,
            ),
        ],
        f"forward-backward at context {context}: tf32 on the best path, eager {' and '.join(eager_sizes[1:-2])}",
    )

    repos = [STUDENT_REPO, *student_repos]
    # 2025's leaderboard shape (16 heads of 64, sequence 16384, bf16, causal), do_bench, from the student's root
    batch_heads, lengths = ("16", ["16384"]) if gpu else ("2", ["64"])
    extras = Stage(
        "extras",
        50 + 25 * len(student_repos),
        [
            *[
                Command(
                    f"flash at the leaderboard's shape ({'fixture' if repo == STUDENT_REPO else repo.name})",
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
                        batch_heads,
                        "--head-dims",
                        "64",
                        "--context-lengths",
                        *lengths,
                        "--precisions",
                        "bf16",
                        "--implementations",
                        "flash-triton",
                        "flash-pytorch",
                        "sdpa",
                        "compiled",
                        "--max-seconds",
                        "2",
                        *(["--measure-steps", "2", "--warmup-steps", "1"] if dry_run else []),
                        "--output",
                        out(f"extras/attention_{'fixture' if repo == STUDENT_REPO else repo.name}.csv"),
                        "--output",
                        out(f"extras/attention_{'fixture' if repo == STUDENT_REPO else repo.name}.jsonl"),
                    ),
                    25,
                    cwd=repo.resolve(),
                )
                for repo in repos
            ],
            Command(
                "a CUDA-graph train step",
                sweep(
                    "extras/cuda_graphs",
                    small_batch,
                    "--model-sizes",
                    "small",
                    "--pass-types",
                    "train-step",
                    "--precisions",
                    "bf16",
                    "--cuda-graphs",
                ),
                12,
                cpu_refusal="--cuda-graphs needs a CUDA device",
            ),
            Command(
                "memory snapshot",
                tool(
                    "benchmark",
                    *shape,
                    *device,
                    *peak,
                    "--model-size",
                    "medium" if gpu else "small",
                    "--context-length",
                    context,
                    "--pass-type",
                    "train-step",
                    "--precision",
                    "bf16",
                    "--warmup-steps",
                    "1",
                    "--measure-steps",
                    "2",
                    "--no-profile-step",
                    "--memory-snapshot",
                    out("extras/snapshot.pickle"),
                    "--output",
                    out("extras/snapshot_step.csv"),
                ),
                8,
                cpu_refusal="needs a CUDA device",
            ),
            Command(
                "its timeline",
                tool(
                    "memory.timeline",
                    "--snapshot",
                    out("extras/snapshot.pickle"),
                    "--plot",
                    out("extras/snapshot_timeline.png"),
                    "--output",
                    out("extras/snapshot_largest.csv"),
                ),
                5,
                cpu_refusal="snapshot.pickle: cannot read a memory snapshot",  # the CPU made none
            ),
        ],
        "the leaderboard's attention shape (a student's Triton FlashAttention-2), a CUDA-graph step, "
        "a memory snapshot and its timeline",
    )
    return [environment, fast_path, gpu_tests, precision, extras]


STAGES = ("environment", "fast_path", "gpu_tests", "precision", "extras")
GPU_TEST_FILES = (
    "tests/test_gpu.py",
    "tests/test_gpu_cuda_graphs.py",
    "tests/test_gpu_fast_path.py",
    "tests/test_attention_gpu.py",
)


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


def run_command(command: Command, limit_s: float, stage_dir: Path, log, dry_run: bool = False) -> str:
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
    printed: list[str] = []
    process = subprocess.Popen(
        command.argv, cwd=command.cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    sinks = [log] + ([open(stage_dir / command.log, "w")] if command.log else [])  # noqa: SIM115

    def pump() -> None:
        for chunk in iter(lambda: os.read(process.stdout.fileno(), 65536), b""):
            text = chunk.decode(errors="replace")
            printed.append(text)
            for sink in sinks:
                sink.write(text)
                sink.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        rc = process.wait(timeout=limit_s)
        reader.join(timeout=5)
        refused = dry_run and rc == 2 and command.cpu_refusal and command.cpu_refusal in "".join(printed)
        status = "ok" if rc == 0 else "ok (refused on the CPU, as documented)" if refused else f"failed (rc {rc})"
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
    scale = DRY_RUN_SLACK if dry_run else 1
    summary = []
    for stage in stages:
        number = STAGES.index(stage.name) + 1
        stage_dir = work / stage.name
        stage_dir.mkdir(parents=True, exist_ok=True)
        print(f"=== stage {number} {stage.name} (limit {stage.limit_s} s): {stage.about}", file=log, flush=True)
        stage_started = time.monotonic()
        statuses = []
        for command in stage.commands:
            spent, stage_spent = time.monotonic() - started, time.monotonic() - stage_started
            left = min(scale * stage.limit_s - stage_spent, limit_s - spent)
            if left < 5:
                statuses.append((command.label, "not run (time limit)"))
                print(f"=== {command.label}: not run, the time is spent", file=log, flush=True)
                continue
            statuses.append(
                (command.label, run_command(command, min(scale * command.limit_s, left), stage_dir, log, dry_run))
            )
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
    print("\n=== the call: stage, seconds, commands", file=log)
    failed = False
    for name, seconds, statuses in summary:
        line = "; ".join(f"{label}: {status}" for label, status in statuses)
        print(f"{name:15s} {seconds:5.0f} s  {line}", file=log)
        failed |= any(not status.startswith("ok") for _, status in statuses)
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
    parser.add_argument(
        "--limit",
        type=int,
        help=f"seconds for all stages ({CALL_LIMIT_S} on the GPU, {DRY_RUN_LIMIT_S} for a dry run)",
    )
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
    limit = args.limit or (DRY_RUN_LIMIT_S if args.dry_run else CALL_LIMIT_S)
    return run(out, args.dry_run, args.stages, args.student_repo, limit)


if __name__ == "__main__":
    sys.exit(main())
