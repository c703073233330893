"""Text input files -> UTF-8 text Spark can read, decided per file, with nothing altered silently.

Spark reads text as UTF-8 and replaces undecodable bytes with U+FFFD without a word; a byte-order
mark becomes part of the first column's name. So before Spark sees a CSV or JSON file:

- a UTF-8 byte-order mark is stripped (Excel's "CSV UTF-8"), a UTF-16 one selects UTF-16 (when
  the file is not valid UTF-16 after all, it is read as `input_encoding` says, line by line);
- every line is decoded strictly with the file's encoding (`input_encoding`, UTF-8 by default);
- a line that does not decode is kept as a *marked* line: `UNDECODABLE` followed by the line with
  its bad bytes escaped (`\\xNN`). The reader turns it into an `invalid_events` row with the
  reason `REASON` and that escaped text as its raw value — counted, never dropped or altered;
- when nothing needs changing (plain UTF-8, no BOM: the usual case) Spark reads the file itself;
  otherwise it reads a UTF-8 copy written to a work folder.

Plain Python, no Spark: unit-tested on bytes.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from pathlib import Path

from sessionize_assets.errors import UserError

UNDECODABLE = "\u0000sessionize:undecodable\u0000"
"""Prefix of a line whose bytes did not decode (never valid CSV or JSON text)."""

UTF8_BOM = codecs.BOM_UTF8
UTF16_BOMS = (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
_CHUNK = 1 << 20


def reason(encoding: str) -> str:
    """The `invalid_events` reason of an undecodable line."""
    return f"undecodable bytes (not valid {encoding}; set input_encoding if the file uses another)"


@dataclass(frozen=True)
class DecodedFile:
    """What Spark reads for one input file, and what was done to get it."""

    source: Path
    readable: Path  # the file itself, or its UTF-8 copy
    encoding: str
    bom_stripped: bool = False
    undecodable_lines: int = 0

    @property
    def copied(self) -> bool:
        return self.readable != self.source


def _is_clean_utf8(path: Path) -> bool:
    """True when the whole file decodes as UTF-8 and has no BOM (read in chunks)."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    with path.open("rb") as handle:
        first = True
        while chunk := handle.read(_CHUNK):
            if first and chunk.startswith(UTF8_BOM):
                return False
            first = False
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError:
                return False
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            return False
    return True


def decode_line(raw: bytes, encoding: str) -> tuple[str, bool]:
    """(the line as text without its line break, True if it decoded). An undecodable line comes
    back marked (`UNDECODABLE` + its bytes escaped), so the reader can reject it with its raw
    bytes visible."""
    body = raw.rstrip(b"\r\n")
    try:
        return body.decode(encoding, "strict"), True
    except UnicodeDecodeError:
        return UNDECODABLE + body.decode(encoding, "backslashreplace"), False


def decode_file(path: Path, encoding: str, work_dir: Path) -> DecodedFile:
    """The UTF-8 text Spark should read for `path` (see the module docstring)."""
    encoding = codecs.lookup(encoding).name
    if encoding == "utf-8" and _is_clean_utf8(path):
        return DecodedFile(source=path, readable=path, encoding=encoding)
    data = path.read_bytes()
    bom = False
    if data.startswith(UTF8_BOM):
        data, bom, encoding = data[len(UTF8_BOM) :], True, "utf-8"
    elif data.startswith(UTF16_BOMS):
        try:
            data, bom, encoding = data.decode("utf-16").encode("utf-8"), True, "utf-16"
        except UnicodeDecodeError:
            # Not UTF-16 after all (binary data starting with FF FE, say): read as the setting
            # says, so its lines are rejected as undecodable rather than stopping the command.
            pass
    work_dir.mkdir(parents=True, exist_ok=True)
    target = work_dir / f"{len(list(work_dir.iterdir())):06d}-{path.name}"
    bad = 0
    with target.open("w", encoding="utf-8", newline="\n") as out:
        for raw in data.splitlines(keepends=True):
            text, ok = decode_line(raw, "utf-8" if encoding == "utf-16" else encoding)
            bad += not ok
            out.write(text + "\n")
    return DecodedFile(
        source=path, readable=target, encoding=encoding, bom_stripped=bom, undecodable_lines=bad
    )


def header_text(decoded: DecodedFile) -> str | None:
    """The first line of the readable text (the CSV header), without its line break; None when
    its bytes did not decode."""
    with decoded.readable.open("rb") as handle:
        raw = handle.readline()
    text, ok = decode_line(raw, "utf-8")
    if not ok or text.startswith(UNDECODABLE):
        return None
    return text


def first_line(decoded: DecodedFile) -> str:
    """`header_text`, or a UserError naming the file when the line did not decode."""
    text = header_text(decoded)
    if text is None:
        raise UserError(
            f"{decoded.source}'s first line (the CSV header) is not {decoded.encoding} text; "
            "set input_encoding to the file's encoding."
        )
    return text
