from __future__ import annotations

import pytest

from gateway.sizes import MAX_SIZE, SizeError, format_size, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("1", 1),
        ("512", 512),
        ("1b", 1),
        ("64k", 64 * 1024),
        ("64K", 64 * 1024),
        ("64kb", 64 * 1024),
        ("64KiB", 64 * 1024),
        ("256m", 256 * 1024**2),
        ("256mb", 256 * 1024**2),
        ("256MiB", 256 * 1024**2),
        ("1g", 1024**3),
        ("1G", 1024**3),
        ("2t", 2 * 1024**4),
        (1048576, 1048576),
        (0, 0),
    ],
)
def test_accepted_forms(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "bad",
    ["", "m", "1.5g", "-1", "-1m", "1 m", " 1m", "1m ", "1m\n", "1x", "1mm", "1ib", "1gbb", "0x10", "1e6", "\uff11m"],
)
def test_rejected_strings_name_the_accepted_forms(bad: str) -> None:
    with pytest.raises(SizeError, match="expected an integer number of bytes"):
        parse_size(bad)


@pytest.mark.parametrize("bad", [True, False, 1.0, None, [], {}, -5])
def test_rejected_types(bad: object) -> None:
    with pytest.raises(SizeError):
        parse_size(bad)


def test_engine_maximum_is_exact_boundary() -> None:
    assert parse_size(MAX_SIZE) == MAX_SIZE
    with pytest.raises(SizeError, match="larger"):
        parse_size(MAX_SIZE + 1)
    with pytest.raises(SizeError, match="larger"):
        parse_size("99999999999999999999t")


def test_format_size_round_trips() -> None:
    for n in (1, 1000, 1024, 64 * 1024, 256 * 1024**2, 3 * 1024**3 + 1):
        assert parse_size(format_size(n)) == n
    assert format_size(268435456) == "256m"
