"""Decoding input files before Spark reads them (plain Python, bytes in, text out)."""

import codecs

import pytest

from sessionize_assets.errors import UserError
from sessionize_assets.ingest.decode import (
    UNDECODABLE,
    decode_file,
    decode_line,
    first_line,
    header_text,
)


@pytest.mark.parametrize(
    ("raw", "encoding", "expected", "ok"),
    [
        (b"a,b\n", "utf-8", "a,b", True),
        (b"caf\xc3\xa9\r\n", "utf-8", "caf\u00e9", True),
        (b"caf\xe9\n", "utf-8", UNDECODABLE + "caf\\xe9", False),
        (b"caf\xe9\n", "iso8859-1", "caf\u00e9", True),
        (b"\x81\n", "cp1252", UNDECODABLE + "\\x81", False),  # undefined in cp1252
    ],
)
def test_decode_line(raw, encoding, expected, ok) -> None:
    assert decode_line(raw, encoding) == (expected, ok)


def test_clean_utf8_is_read_in_place(tmp_path) -> None:
    f = tmp_path / "a.csv"
    f.write_bytes("h\n\u00e9\n".encode())
    decoded = decode_file(f, "utf-8", tmp_path / "work")
    assert decoded.readable == f and not decoded.copied and decoded.undecodable_lines == 0


def test_bom_is_stripped_and_bad_bytes_far_in_are_marked(tmp_path) -> None:
    f = tmp_path / "a.csv"
    body = b"h\n" + b"x" * 10_000 + b"\n" + b"bad\xff\xfeline\n" + b"ok\n"
    f.write_bytes(codecs.BOM_UTF8 + body)
    decoded = decode_file(f, "utf-8", tmp_path / "work")
    assert decoded.copied and decoded.bom_stripped and decoded.undecodable_lines == 1
    lines = decoded.readable.read_text(encoding="utf-8").split("\n")
    assert lines[0] == "h" and first_line(decoded) == "h"
    assert lines[2] == UNDECODABLE + "bad\\xff\\xfeline"
    assert lines[3] == "ok"


def test_utf16_bom_selects_utf16(tmp_path) -> None:
    f = tmp_path / "a.csv"
    f.write_bytes("h,i\n1,\u00e9\n".encode("utf-16"))
    decoded = decode_file(f, "utf-8", tmp_path / "work")
    assert decoded.encoding == "utf-16" and decoded.undecodable_lines == 0
    assert decoded.readable.read_text(encoding="utf-8") == "h,i\n1,\u00e9\n"


def test_an_undecodable_header_is_one_sentence(tmp_path) -> None:
    f = tmp_path / "a.csv"
    f.write_bytes(b"\x89PNG\xff\n1\n")
    decoded = decode_file(f, "utf-8", tmp_path / "work")
    with pytest.raises(UserError, match="first line .* is not utf-8 text"):
        first_line(decoded)


def test_a_false_utf16_bom_is_read_line_by_line_not_an_error(tmp_path) -> None:
    """Binary data starting with FF FE (not valid UTF-16): its lines are marked undecodable
    (rejected rows later), instead of one error stopping the whole command."""
    f = tmp_path / "a.csv"
    f.write_bytes(b"\xff\xfe\x00\xd8\x01\n\x02\n")
    decoded = decode_file(f, "utf-8", tmp_path / "work")
    assert decoded.encoding == "utf-8" and not decoded.bom_stripped
    assert decoded.undecodable_lines == 1
    lines = decoded.readable.read_text(encoding="utf-8").split("\n")
    assert lines[:2] == [UNDECODABLE + "\\xff\\xfe\x00\\xd8\x01", "\x02"]
    assert header_text(decoded) is None


def test_header_text_of_a_text_first_line(tmp_path) -> None:
    f = tmp_path / "a.csv"
    f.write_bytes(b"h,i\r\n1,2\n")
    assert header_text(decode_file(f, "utf-8", tmp_path / "work")) == "h,i"
