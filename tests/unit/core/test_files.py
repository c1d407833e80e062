"""Files that appear whole (gateway._files): the rename, what a failure leaves, and the name an error gives."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from gateway._files import output_file, whole_file


def test_a_whole_file_replaces_the_old_one_only_when_its_block_ends(tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    target.write_bytes(b"old")
    with whole_file(target, mode=0o640) as fh:
        fh.write(b"new")
        assert target.read_bytes() == b"old"  # a reader sees the old file until the rename
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]


def test_a_block_that_raises_leaves_the_old_file_and_no_temporary_one(tmp_path: Path) -> None:
    target = tmp_path / "export.ocsf"
    target.write_bytes(b"old")

    def export() -> None:
        with whole_file(target, sync=True) as fh:
            fh.write(b"half")
            raise RuntimeError("the export failed")

    with pytest.raises(RuntimeError):
        export()
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["export.ocsf"]


def test_a_file_that_cannot_be_created_is_an_error_naming_it_not_its_temporary_name(tmp_path: Path) -> None:
    target = tmp_path / "missing" / "anchor.json"
    with pytest.raises(FileNotFoundError) as caught, whole_file(target):
        pass
    assert caught.value.filename == str(target)


def test_an_output_that_is_not_a_regular_file_is_written_as_it_is(tmp_path: Path) -> None:
    with output_file("/dev/null") as fh:
        fh.write(b"discarded")
    assert Path("/dev/null").is_char_device()
    with output_file(str(tmp_path / "out"), mode=0o600) as fh:
        fh.write(b"kept")
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o600
