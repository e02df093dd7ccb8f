"""Strict readers for the dataset formats: JSON, JSON lines and CSV files read with errors that name the
file, the record and the field; typed field access; the requested splits; the images a record points
to checked (none, exists, decode) in strict or lenient mode (`ReadContext`).
"""
from __future__ import annotations

import contextvars
import csv
import io
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from PIL import Image

from lib.compendium.artifacts import loads_strict
from lib.data.records import DataError


@dataclass
class ReadContext:
    strict: bool
    check_images: str
    allow_outside: bool = False
    report: list[str] = field(default_factory=list)
    splits_read: list[tuple[str, str]] = field(default_factory=list)   # (split, file) each loader read

    def read_split(self, split: str, path: Path) -> None:
        self.splits_read.append((split, str(path)))

    def split_files(self, requested, available: tuple[str, ...], name: str, path_of) -> Iterator[tuple[str, Path]]:
        """Each requested split of dataset `name` with its file (`path_of(split)`), refused when the file is
        missing, and recorded as read."""
        for split in select_splits(requested, available, name):
            path = path_of(split)
            if not path.exists():
                raise DataError(f"{path}: missing file for split '{split}'")
            self.read_split(split, path)
            yield split, path

    def image(self, base: Path | str, rel: Any, where: str, key: str = "img") -> Path:
        """The image path `rel` under `base`, refused when it leaves base (`..`, an absolute path)."""
        if not isinstance(rel, str) or not rel.strip():
            raise DataError(f"{where}: field '{key}' is {rel!r}, expected a relative image path")
        base = Path(base)
        p = base / rel
        if self.allow_outside:
            return p
        # lexical check: `..` and absolute paths are refused; a symlink placed inside the dataset
        # (a shared image store) is the user's own choice and is followed
        b = os.path.normpath(os.path.abspath(base))
        r = os.path.normpath(os.path.abspath(p))
        if Path(rel).is_absolute() or not (r == b or r.startswith(b + os.sep)):
            raise DataError(f"{where}: field '{key}' {rel!r} points outside the image folder {base} "
                            f"(load with allow_outside_images=True to permit it)")
        return p

    def keep(self, out: list, rec: Any, where: str) -> None:
        """Append record `rec` to `out` when its image is usable (`image_ok`: else raised or reported)."""
        if self.image_ok(rec.img_path, where):
            out.append(rec)

    def image_ok(self, path: Path, where: str) -> bool:
        """Whether the record's image is usable; raise (strict) or report (lenient) if not."""
        if self.check_images == "none":
            return True
        problem = None
        if not path.is_file():
            problem = f"image {path} does not exist"
        elif self.check_images == "decode":
            try:
                with Image.open(path) as im:
                    im.load()                      # every pixel: a truncated file fails here
            except Exception as e:  # PIL raises many types for broken files
                problem = f"image {path} cannot be decoded ({type(e).__name__}: {e})"
        if problem is None:
            return True
        if self.strict:
            raise DataError(f"{where}: field 'img': {problem}")
        self.report.append(f"{where}: skipped: {problem}")
        return False


def check_unique(records: list, name: str, root: Path) -> None:
    seen: dict[tuple[str, str], int] = {}
    for i, r in enumerate(records):
        key = (getattr(r, "split", ""), r.id)
        if key in seen:
            raise DataError(f"{name} at {root}: duplicate id '{r.id}' in split '{key[0]}' "
                            f"(records {seen[key]} and {i})")
        seen[key] = i


#: the files the running loader has read (load() names them when a dataset has no records)
FILES_READ: contextvars.ContextVar[list[Path] | None] = contextvars.ContextVar("files_read", default=None)


def read_text_file(path: Path) -> str:
    """UTF-8 (a leading BOM accepted); anything else is an error naming the file and byte offset."""
    read = FILES_READ.get()
    if read is not None:
        read.append(Path(path))
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: file does not exist") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8: byte 0x{data[e.start]:02x} at offset {e.start} "
                        f"(re-save the file as UTF-8)") from None


def loads_json(text: str, where: str) -> Any:
    return loads_strict(text, where, DataError)


def read_json_file(path: Path, expect: type | None = None) -> Any:
    try:
        data = loads_json(read_text_file(path), str(path))
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: malformed JSON at line {e.lineno}, column {e.colno}: {e.msg}") from e
    if expect is not None and not isinstance(data, expect):
        raise DataError(f"{path}: the top level is a JSON {type(data).__name__}, expected a JSON "
                        f"{'list' if expect is list else 'object'}")
    return data


def json_objects(data: list, path: Path) -> Iterator[tuple[int, dict]]:
    """(index, record) for a JSON list whose every item must be an object."""
    for i, obj in enumerate(data):
        if not isinstance(obj, dict):
            raise DataError(f"{path}: record {i} is a JSON {type(obj).__name__}, expected an object")
        yield i, obj


def read_jsonl_file(path: Path) -> Iterator[tuple[int, dict]]:
    for ln, line in enumerate(read_text_file(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = loads_json(line, f"{path}: line {ln}")
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: line {ln}: malformed JSON: {e.msg}") from e
        if not isinstance(obj, dict):
            raise DataError(f"{path}: line {ln}: expected a JSON object, got {type(obj).__name__}")
        yield ln, obj


MAX_FIELD_LINES = 200


def read_csv_file(path: Path, need: set[str] | tuple[str, ...], delimiter: str = ",", multiline: bool = False
              ) -> Iterator[tuple[int, dict]]:
    """(line, row) for a CSV read strictly: header must hold `need`; each row exactly as many
    fields as the header; a row on one line unless the format has multi-line fields (MemeSense's
    analyses), and then on at most MAX_FIELD_LINES lines (an unbalanced quote swallows the rows
    after it into one field)."""
    text = read_text_file(path)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    try:
        header = next(reader)
    except StopIteration:
        raise DataError(f"{path}: empty file (no header)") from None
    except csv.Error as e:
        raise DataError(f"{path}: line 1: malformed CSV header: {e}") from None
    header = [h.strip() for h in header]
    lacking = sorted(set(need) - set(header))
    if lacking:
        raise DataError(f"{path}: header lacks {lacking} (has {header})")
    prev = reader.line_num
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise DataError(f"{path}: line {reader.line_num}: malformed CSV: {e}") from None
        start, prev = prev + 1, reader.line_num
        if not row or row == [""]:
            continue
        span = reader.line_num - start + 1
        if span > 1 and not multiline or span > MAX_FIELD_LINES:
            raise DataError(f"{path}: lines {start}-{reader.line_num}: one field spans {span} lines "
                            f"(an unbalanced quote?)")
        if len(row) != len(header):
            raise DataError(f"{path}: line {start}: {len(row)} fields, the header has {len(header)}")
        yield start, dict(zip(header, row))


def field_of(obj: dict, key: str, where: str, types: type | tuple = (str,), optional: bool = False) -> Any:
    if key not in obj or obj[key] is None:
        if optional:
            return None
        raise DataError(f"{where}: missing field '{key}'")
    v = obj[key]
    tt = types if isinstance(types, tuple) else (types,)
    if isinstance(v, bool) and bool not in tt:     # True is an int to Python, not an id or a count
        raise DataError(f"{where}: field '{key}' is a boolean ({v!r}), expected "
                        f"{' or '.join(t.__name__ for t in tt)}")
    if types and not isinstance(v, types):
        raise DataError(f"{where}: field '{key}' is {type(v).__name__} ({v!r}), expected "
                        f"{' or '.join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))}")
    return v


def record_id(obj: dict, key: str, where: str) -> str:
    """An id: an integer or a non-empty string (never null, a boolean or a float)."""
    v = field_of(obj, key, where, (int, str))
    if isinstance(v, str) and not v.strip():
        raise DataError(f"{where}: field '{key}' is an empty string")
    return str(v)


def str_list(obj: dict, key: str, where: str, optional: bool = False) -> list[str]:
    v = field_of(obj, key, where, list, optional=optional)
    if v is None:
        return []
    bad = [i for i, x in enumerate(v) if not isinstance(x, str)]
    if bad:
        raise DataError(f"{where}: field '{key}[{bad[0]}]' is {type(v[bad[0]]).__name__}, expected str")
    return v


def as_bool(obj: dict, key: str, where: str) -> bool:
    v = obj[key]
    if not isinstance(v, bool):
        raise DataError(f"{where}: field '{key}' is {v!r}, expected true or false")
    return v


def as_number(obj: dict, key: str, where: str) -> float:
    v = field_of(obj, key, where, (int, float))
    if not math.isfinite(float(v)):
        raise DataError(f"{where}: field '{key}' is {v!r}, expected a finite number")
    return float(v)


def as_label(v: Any, allowed: set, where: str, key: str = "label") -> int:
    if isinstance(v, bool):
        raise DataError(f"{where}: field '{key}' is {v!r}, not one of {sorted(allowed)}")
    try:
        iv = int(v)
    except (TypeError, ValueError):
        raise DataError(f"{where}: field '{key}' is {v!r}, not one of {sorted(allowed)}") from None
    if iv != v and not (isinstance(v, str) and v.strip() == str(iv)) or iv not in allowed:
        raise DataError(f"{where}: field '{key}' is {v!r}, not one of {sorted(allowed)}")
    return iv


def select_splits(requested: tuple[str, ...] | list[str] | str | None, available: tuple[str, ...], name: str
            ) -> tuple[str, ...]:
    """The splits to read: None for all; otherwise a list (or tuple) of split names. A plain string
    is refused (a loop over it would read its letters, and "train,dev" is not a split either), as are
    an empty list, a non-string entry and an unknown split; each message says what is valid."""
    if requested is None:
        return available
    if isinstance(requested, str):
        raise DataError(f"dataset '{name}': splits must be a list of split names, e.g. [{requested.split(',')[0]!r}]; "
                        f"got the string {requested!r}. Its splits: {', '.join(available)}")
    if not isinstance(requested, (list, tuple)) or not requested:
        raise DataError(f"dataset '{name}': splits must be a non-empty list of split names, got {requested!r}; "
                        f"its splits: {', '.join(available)}")
    bad = [s for s in requested if not isinstance(s, str) or s not in available]
    if bad:
        raise DataError(f"dataset '{name}' has no split {', '.join(map(repr, bad))}; its splits: {', '.join(available)}")
    return tuple(dict.fromkeys(requested))
