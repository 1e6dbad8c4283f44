"""scripts/dev/gpu_first.py and gpu_collect.py: the one prepared GPU call fits its lease, its CPU dry
run exercises the same tools and flags, and what it brings back is packed and summarised faithfully."""

from __future__ import annotations

import importlib.util
import io
import json
import sys
import tarfile
from pathlib import Path

import pytest

from tests.helpers import REPO

sys.path.insert(0, str(REPO / "scripts" / "dev"))  # gpu_first imports gpu_collect beside it
first = importlib.import_module("gpu_first")
collect = importlib.import_module("gpu_collect")
H100, H200 = 81559 * 2**20, 143771 * 2**20  # the cards' total memory as torch reports it


@pytest.mark.parametrize("memory", [H100, H200])
def test_the_gpu_call_fits_one_lease(memory):
    stages = first.plan(Path("/w"), dry_run=False, student_repos=[], device_memory_bytes=memory)
    assert [stage.name for stage in stages] == list(first.STAGES)
    assert sum(stage.limit_s for stage in stages) <= first.CALL_LIMIT_S
    assert first.START_UP_S + 2 * first.CALL_LIMIT_S <= first.LEASE_S  # start-up, the call and one re-run
    for stage in stages:
        assert all(command.limit_s <= stage.limit_s for command in stage.commands), stage.name


def flags(argv: list[str]) -> tuple[str, set[str]]:
    tool = argv[argv.index("cs336_bench") + 1] if "cs336_bench" in argv else Path(argv[1]).name
    return tool, {arg for arg in argv if arg.startswith("--")}


def test_the_dry_run_exercises_the_gpu_calls_tools_and_flags():
    """What makes it a dry run: tiny shapes, a given MFU peak, fewer steps; every other flag the same."""
    tiny = {"--d-model", "--d-ff", "--num-layers", "--num-heads", "--vocab-size", "--peak-tflops", "--no-compile"}
    shorter = {"--measure-steps", "--warmup-steps"}  # tools whose GPU default is long
    gpu = first.plan(Path("/w"), dry_run=False, student_repos=[], device_memory_bytes=H100)
    dry = first.plan(Path("/w"), dry_run=True, student_repos=[])
    assert [s.name for s in gpu] == [s.name for s in dry]
    for gpu_stage, dry_stage in zip(gpu, dry, strict=True):
        assert len(gpu_stage.commands) == len(dry_stage.commands), gpu_stage.name
        for on_gpu, on_cpu in zip(gpu_stage.commands, dry_stage.commands, strict=True):
            gpu_tool, gpu_flags = flags(on_gpu.argv)
            cpu_tool, cpu_flags = flags(on_cpu.argv)
            assert gpu_tool == cpu_tool
            assert gpu_flags - shorter == cpu_flags - tiny - shorter, on_gpu.label


def test_the_fast_path_micro_batch_comes_from_the_estimator():
    assert first.fast_micro_batch(H200) == 8
    assert first.fast_micro_batch(40 * 2**30) == 4  # an A100 40GB: 8 x 4 would not fit
    assert first.fast_micro_batch(None) == 4


def archive(folder: Path, name: str, files: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(folder / name, "w:gz") as tar:
        for path, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_collect_replaces_a_result_whole_keeps_the_rest_and_skips_unsafe_names(tmp_path):
    archive(tmp_path / "call1", "1-environment.tgz", {"1-environment/gpu_tests.xml": "old", "1-environment/x.md": "x"})
    archive(tmp_path / "call1", "2-fast_path.tgz", {"2-fast_path/a.csv": "a1", "2-fast_path/a.jsonl": "a1"})
    archive(tmp_path / "call2", "2-fast_path.tgz", {"fast_path/a.csv": "a2", "fast_path/b.csv": "b2"})
    archive(
        tmp_path / "call2",
        "1-environment.tgz",
        {"environment/gpu_tests.txt": "new", "environment/../../evil": "no", "/abs/evil": "no"},
    )
    into = tmp_path / "into"
    collect.unpack([tmp_path / "call1", tmp_path / "call2"], into)
    found = {p.relative_to(into).as_posix(): p.read_text() for p in into.rglob("*") if p.is_file()}
    # the later call's a.csv replaced a.csv and its twin a.jsonl; b.csv is new; x.md stays
    assert found == {
        "environment/gpu_tests.txt": "new",
        "environment/x.md": "x",
        "fast_path/a.csv": "a2",
        "fast_path/b.csv": "b2",
    }


def test_collect_refuses_a_folder_without_archives(tmp_path, capsys):
    assert collect.collect([tmp_path]) == 2
    assert "no stage archives" in capsys.readouterr().err


def test_the_committed_gpu_pages_are_made_from_the_committed_results():
    cards = sorted(p for p in (REPO / "results" / "gpu").iterdir() if (p / "README.md").is_file())
    for card in cards:
        assert (card / "README.md").read_text() == collect.summary(card, link=""), card.name
        json.loads((card / "environment" / "versions.json").read_text())  # the machine's record is there
    assert (REPO / "docs" / "gpu.md").read_text() == collect.docs_page()


def test_a_dry_run_counts_a_documented_cpu_refusal_and_nothing_else(tmp_path):
    """A CUDA-only command passes the dry run when the CPU refuses it with its documented reason (its
    flags parsed); another exit 2, or the same refusal on the GPU, is a failure."""
    refuse = [sys.executable, "-c", "import sys; print('--memory-snapshot needs a CUDA device'); sys.exit(2)"]
    other = [sys.executable, "-c", "import sys; print('unrecognized arguments: --old-flag'); sys.exit(2)"]
    documented = first.Command("snapshot", refuse, 20, cpu_refusal="needs a CUDA device")
    with open(tmp_path / "log", "w") as log:
        assert first.run_command(documented, 20, tmp_path, log, dry_run=True).startswith("ok")
        assert first.run_command(documented, 20, tmp_path, log, dry_run=False) == "failed (rc 2)"
        renamed = first.Command("renamed", other, 20, cpu_refusal="needs a CUDA device")
        assert first.run_command(renamed, 20, tmp_path, log, dry_run=True) == "failed (rc 2)"
