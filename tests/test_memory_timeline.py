"""memory.timeline on a synthetic snapshot: the active-memory series memory_viz draws, and the
largest allocations with the first frame outside torch."""

from __future__ import annotations

import pickle

import pandas as pd

from cs336_systems.memory import timeline

MIB = 2**20
TORCH = {"filename": "/venv/lib/python3.12/site-packages/torch/nn/functional.py", "line": 9, "name": "linear"}


def mine(line: int) -> dict:
    return {"filename": "/repo/cs336_basics/model.py", "line": line, "name": "forward"}


# 1 MiB was live before the recording (freed at event 4); 2 MiB still live at the end, never allocated in it
SNAPSHOT = {
    "segments": [  # as torch writes them: a block's address is the segment's plus the blocks before it
        {"device": 0, "address": 900, "blocks": [{"size": 2 * MIB, "state": "active_allocated"}]},
        {
            "device": 0,
            "address": 100 - 4 * MIB,
            "blocks": [{"size": 4 * MIB, "state": "inactive"}, {"size": 8 * MIB, "state": "active_allocated"}],
        },
    ],
    "device_traces": [
        [
            {"action": "segment_alloc", "addr": 0, "size": 64 * MIB, "frames": []},
            {"action": "alloc", "addr": 100, "size": 8 * MIB, "frames": [TORCH, mine(40)]},
            {"action": "alloc", "addr": 200, "size": 4 * MIB, "frames": [mine(41)]},
            {"action": "free_requested", "addr": 200, "size": 4 * MIB, "frames": []},
            {"action": "free_completed", "addr": 200, "size": 4 * MIB, "frames": []},
            {"action": "free_completed", "addr": 500, "size": 1 * MIB, "frames": []},
            {"action": "alloc", "addr": 300, "size": 16 * MIB, "frames": [TORCH]},
        ]
    ],
}


def test_the_active_series_counts_blocks_from_before_the_recording():
    before = 3 * MIB
    assert timeline.active_memory_timeline(SNAPSHOT) == [
        before + 8 * MIB,
        before + 12 * MIB,
        before + 8 * MIB,
        before + 7 * MIB,
        before + 23 * MIB,
    ]
    assert timeline.active_memory_timeline({"device_traces": []}) == []


def test_largest_allocations_name_the_first_frame_outside_torch():
    rows = timeline.largest_allocations(SNAPSHOT, top=2)
    assert [r["size_mib"] for r in rows] == [16.0, 8.0]
    assert rows[0]["user_frame"] == "(no frame outside torch)"
    assert rows[1]["user_frame"] == "/repo/cs336_basics/model.py:40 in forward" and rows[1]["event_index"] == 1


def test_cli_writes_the_image_and_the_table(tmp_path, capsys):
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(SNAPSHOT))
    png, csv = tmp_path / "t.png", tmp_path / "largest.csv"
    assert timeline.main(["--snapshot", str(path), "--plot", str(png), "--output", str(csv), "--top", "3"]) == 0
    assert png.read_bytes().startswith(b"\x89PNG") and len(pd.read_csv(csv)) == 3
    assert "peak active 0.025 GiB" in capsys.readouterr().out
    assert timeline.main(["--snapshot", str(tmp_path / "none.pickle"), "--plot", str(png)]) == 2
    assert "cannot read a memory snapshot" in capsys.readouterr().err
