"""MkDocs hook: the committed results/ and writeup/ files served with the site, so the pages link
and show them (`results/warmup_study_cpu.png`) from where they are, never copied into docs/."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
SERVED = ("results", "writeup")
SUFFIXES = {".png", ".md", ".csv", ".jsonl", ".json", ".txt", ".pdf"}


def on_files(files: Files, config, **_) -> Files:
    for folder in SERVED:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix in SUFFIXES:
                uri = path.relative_to(ROOT).as_posix()
                files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files
