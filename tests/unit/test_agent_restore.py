"""Restore refuses a snapshot whose state files went (it would otherwise restore, read them
lazily, and let its next checkpoint reference them again)."""

from __future__ import annotations

from pathlib import Path

from sparkpoint.agent.recovery.restore import missing_files


def test_missing_files_are_found_with_one_listing_per_directory(tmp_path: Path) -> None:
    (tmp_path / "shared").mkdir()
    kept = tmp_path / "shared" / "kg-00001-a.arrow"
    kept.write_bytes(b"x")
    gone = str(tmp_path / "shared" / "kg-00002-b.arrow")
    elsewhere = str(tmp_path / "chk-3" / "kg-00003-c.arrow")
    assert missing_files({str(kept), gone, elsewhere}) == [elsewhere, gone]
    assert missing_files({str(kept)}) == []
    assert missing_files({f"file://{kept}"}) == []
