"""The committed model answers (results/<profile>/cache/responses.jsonl.gz) are untrusted input: every way a
copy can arrive broken (a cut download, a bad CRC, a pointer file a mirror or a large-file tool leaves in its
place, a line that is not an answer, a key answered twice, an answer filed under another model) is one clear
error naming the file, the line and the field, raised before any stage runs, with nothing written."""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import lib.compendium.results as results
import lib.compendium.stages as stages_mod
from lib.models.chat.cache import CacheError, ResponseCache, read_exported
from lib.models.chat.messages import ChatResult


def K(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def _line(key: str = K("a"), model: str = "m", status: str = "ok", **payload) -> dict:
    p = ChatResult(text="hateful", model=model, status=status).to_json()
    p.update(payload)
    return {"key": key, "model": model, "status": status, "payload": p}


def _write(path: Path, rows: list, raw: bytes | None = None) -> Path:
    data = raw if raw is not None else "".join(
        (r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows).encode("ascii")
    path.write_bytes(gzip.compress(data, mtime=0))
    return path


def _good(tmp: Path) -> Path:
    return _write(tmp / "responses.jsonl.gz", [_line(K("a")), _line(K("b"), text="not hateful")])


def test_a_good_export_reads_back(tmp_path):
    got = read_exported(_good(tmp_path))
    assert set(got) == {K("a"), K("b")} and json.loads(got[K("b")][2])["text"] == "not hateful"


def _damaged(tmp: Path, case: str) -> Path:
    f = _good(tmp)
    raw = f.read_bytes()
    if case == "truncated gzip":
        f.write_bytes(raw[: len(raw) // 2])
    elif case == "altered CRC":
        f.write_bytes(raw[:-8] + bytes([raw[-8] ^ 0xFF]) + raw[-7:])
    elif case == "plain text":
        f.write_bytes(gzip.decompress(raw))
    elif case == "git-lfs pointer":
        f.write_bytes(b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"0" * 64 + b"\nsize 123456\n")
    elif case == "git-annex link":
        f.unlink()
        f.symlink_to("../../.git/annex/objects/Xx/Yy/SHA256E-s1--00.gz/SHA256E-s1--00.gz")
    elif case == "0 bytes":
        f.write_bytes(b"")
    elif case == "gzip of nothing":
        f.write_bytes(gzip.compress(b"", mtime=0))
    return f


@pytest.mark.parametrize("case, message", [
    ("truncated gzip", r"the gzip stream is damaged \(EOFError"),
    ("altered CRC", r"the gzip stream is damaged \(BadGzipFile: CRC check failed"),
    ("plain text", r"is not a gzip file \(it starts with b'\{\"key\""),
    ("git-lfs pointer", r"is a Git LFS pointer .*git lfs pull"),
    ("git-annex link", r"is a git-annex pointer .*which is absent"),
    ("0 bytes", r"the file is empty \(0 bytes\)"),
    ("gzip of nothing", r"holds no answers"),
])
def test_a_damaged_file_is_named_with_what_is_wrong(tmp_path, case, message):
    f = _damaged(tmp_path, case)
    with pytest.raises(CacheError, match="responses.jsonl.gz: " + message):
        read_exported(f)
    c = ResponseCache(tmp_path / "c.sqlite")
    with pytest.raises(CacheError):
        c.import_answers(f)
    assert len(c) == 0


@pytest.mark.parametrize("line, message", [
    ("{not json", r"line 2: not JSON \(column 2"),
    ("42", r"line 2: a JSON int, not an exported answer"),
    ('["a", "b"]', r"line 2: a JSON list, not an exported answer"),
    (json.dumps({**_line(K("c")), "extra": 1}), r"line 2: unknown field 'extra'"),
    (json.dumps({k: v for k, v in _line(K("c")).items() if k != "payload"}), r"line 2: field 'payload' is missing"),
    (json.dumps(_line("not-a-key")), r"line 2: field 'key' is 'not-a-key', not a cache key"),
    (json.dumps(_line(K("c").upper())), r"line 2: field 'key' is .*not a cache key"),
    (json.dumps({**_line(K("c")), "key": 7}), r"line 2: field 'key' is 7, not a cache key"),
    (json.dumps(_line(K("c"), status="failed")), r"line 2: field 'status' is 'failed', not a stored one"),
    (json.dumps({**_line(K("c")), "payload": "hateful"}), r"line 2: field 'payload' is a JSON str"),
    (json.dumps(_line(K("c"), text=5)), r"line 2: field 'payload.text' is 5, expected str"),
    (json.dumps(_line(K("c"), attempts=True)), r"line 2: field 'payload.attempts' is True, expected int"),
    (json.dumps(_line(K("c"), surprise=1)), r"line 2: field 'payload.surprise' is not a field of an answer"),
    (json.dumps({**_line(K("c")), "model": "another-model"}),
     r"line 2: field 'model' is 'another-model' but its answer's 'payload.model' is 'm': an answer filed under another model"),
    (json.dumps({**_line(K("c")), "status": "refused"}), r"line 2: field 'status' is 'refused' but .*'payload.status' is 'ok'"),
    (json.dumps(_line(K("a"), text="a different answer")),
     r"line 2: field 'key' [0-9a-f]{16}\.\.\. repeats line 1 with a different answer"),
    ('{"key": "%s", "model": "m", "status": "ok", "payload": {"latency_s": NaN}}' % K("c"),
     r"line 2: field 'payload.latency_s' is NaN"),
])
def test_a_line_that_is_not_an_answer_is_named_with_its_field(tmp_path, line, message):
    f = _write(tmp_path / "responses.jsonl.gz", [_line(K("a")), line])
    with pytest.raises(CacheError, match="responses.jsonl.gz: " + message):
        read_exported(f)


def test_a_non_ascii_byte_is_named_with_its_line(tmp_path):
    f = _write(tmp_path / "responses.jsonl.gz", [], raw=(json.dumps(_line(K("a"))) + "\n").encode() + "\u00e9\n".encode())
    with pytest.raises(CacheError, match=r"line 2: byte 1 is not ASCII"):
        read_exported(f)


def test_the_same_answer_twice_is_one_answer(tmp_path):
    f = _write(tmp_path / "responses.jsonl.gz", [_line(K("a")), _line(K("a"))])
    assert list(read_exported(f)) == [K("a")]


def test_an_export_that_keeps_a_damaged_file_refuses_it_and_leaves_it(tmp_path, monkeypatch):
    """`make test-answers KEEP=1` reads the committed file to keep its answers: a damaged one is refused, not
    half-kept, and stays as it was."""
    f = _damaged(tmp_path, "truncated gzip")
    before = f.read_bytes()
    monkeypatch.setenv("COMPENDIUM_STAGE", "04_few_shot")
    c = ResponseCache(tmp_path / "c.sqlite")
    c.put(K("new"), ChatResult("x", model="m"))
    with pytest.raises(CacheError, match="gzip stream is damaged"):
        c.export(f, keep=True)
    assert f.read_bytes() == before


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    monkeypatch.setattr(stages_mod, "ARTIFACTS_ROOT", tmp_path / "artifacts")
    monkeypatch.setattr(results, "ARTIFACTS_ROOT", tmp_path / "artifacts")
    monkeypatch.setattr(results, "RESULTS_ROOT", tmp_path / "results")
    # the response cache too: a COLD run moves the profile's cache aside, and `make test` runs the real ci profile
    # beside these tests (its live cache must never be touched by them)
    monkeypatch.setattr("lib.models.chat.cache.ROOT", tmp_path)
    ran = []
    monkeypatch.setattr(stages_mod, "run_notebook", lambda st, p, params=None, **kw: ran.append(st.name))
    monkeypatch.setattr(stages_mod, "check_outputs", lambda *a, **k: None)
    monkeypatch.setattr(stages_mod, "run_module", lambda st, p, **kw: ran.append(st.name))
    return tmp_path, ran


@pytest.mark.parametrize("case", ["truncated gzip", "altered CRC", "plain text", "git-lfs pointer", "0 bytes"])
def test_a_run_stops_before_any_stage_on_damaged_committed_answers(sandbox, capsys, case):
    """`make reproduce` reads the committed answers first: a damaged file ends it with exit 2 and one line naming
    the file, before any stage runs, and nothing is written under artifacts/ (no cache, no timings)."""
    tmp, ran = sandbox
    committed = results.cache_export_path("ci")
    committed.parent.mkdir(parents=True)
    good = _good(committed.parent)
    assert good == committed
    _damaged(committed.parent, case)
    before = committed.read_bytes()
    assert stages_mod.reproduce("ci", None, publish=False) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "responses.jsonl.gz" in err and "Traceback" not in err
    assert ran == [] and not (tmp / "artifacts").exists()
    assert committed.read_bytes() == before


def test_a_cold_run_never_reads_the_damaged_file_it_is_the_way_out_of(sandbox):
    """COLD=1 asks every model afresh, so it does not read the committed answers: the remedy the error names works
    on a damaged file, which it leaves as it was."""
    tmp, ran = sandbox
    committed = results.cache_export_path("ci")
    committed.parent.mkdir(parents=True)
    _good(committed.parent)
    _damaged(committed.parent, "truncated gzip")
    before = committed.read_bytes()
    assert stages_mod.reproduce("ci", "00", publish=False, cold=True) == 0
    assert ran == ["00_data_prep"] and committed.read_bytes() == before


def test_the_command_line_names_the_file_without_a_traceback(tmp_path):
    """The whole path a user takes: `python -m lib.compendium.runner reproduce` on a checkout whose committed ci
    answers are a pointer file. Run on a copy of the profile (a child of ci with its own results folder)."""
    from lib import ROOT
    name = f"untrusted-{os.getpid()}"
    prof = ROOT / "params" / f"{name}.yaml"
    res = ROOT / "results" / name
    try:
        prof.write_text("extends: ci\n")
        (res / "cache").mkdir(parents=True)
        (res / "cache" / "responses.jsonl.gz").write_bytes(b"version https://git-lfs.github.com/spec/v1\n")
        r = subprocess.run([sys.executable, "-m", "lib.compendium.runner", "reproduce", "--profile", name, "--only", "00"],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert r.returncode == 2, r.stderr
        assert f"results/{name}/cache/responses.jsonl.gz: is a Git LFS pointer" in r.stderr and "Traceback" not in r.stderr
        assert not (ROOT / "artifacts" / name).exists()
    finally:
        prof.unlink(missing_ok=True)
        import shutil
        shutil.rmtree(res, ignore_errors=True)
        shutil.rmtree(ROOT / "artifacts" / name, ignore_errors=True)
