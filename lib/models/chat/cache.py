"""The one response cache (SQLite): answers keyed by request hash, single-flight across threads
and processes, every answer stored the moment it arrives.

While `make reproduce` runs a stage it names it in COMPENDIUM_STAGE; every answer that stage reads or
stores is then marked as used by it, and `export` writes exactly the answers the stages' last runs
used (results/<profile>/cache/responses.jsonl.gz), which `import_answers` loads into a fresh clone's
cache so that a rerun replays them."""
from __future__ import annotations

import gzip
import io
import json
import os
import re
import socket
import sqlite3
import threading
import time
import zlib
from pathlib import Path

from lib import ROOT
from lib.models.chat.messages import STATUSES, ChatResult
from lib.compendium.artifacts import loads_strict, relpath, write_bytes

#: the environment variable naming the stage that is running (set by lib.compendium.stages)
STAGE_ENV = "COMPENDIUM_STAGE"


class CacheError(RuntimeError):
    """The response cache file is unusable; the message names it."""


class ResponseCache:
    """SQLite store of answers keyed by request hash; safe across threads and processes."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        try:
            self._retry(lambda: self._conn().execute(
                "CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, model TEXT, status TEXT, "
                "created REAL, payload TEXT NOT NULL)"))
            self._retry(lambda: self._conn().execute(
                "CREATE TABLE IF NOT EXISTS claims (key TEXT PRIMARY KEY, owner TEXT NOT NULL, ts REAL NOT NULL)"))
            self._retry(lambda: self._conn().execute(
                "CREATE TABLE IF NOT EXISTS used (key TEXT NOT NULL, stage TEXT NOT NULL, PRIMARY KEY (key, stage))"))
        except sqlite3.DatabaseError as e:
            raise CacheError(f"response cache {self.path} cannot be opened ({e}); move it aside to start a new "
                             f"one (every answer in it would be asked again)") from None

    @staticmethod
    def _retry(fn, attempts: int = 50):
        """SQLite answers 'database is locked' at once, without waiting for the busy timeout, when
        connections race to switch a new file to WAL or to upgrade a lock; such a call is retried."""
        for i in range(attempts):
            try:
                return fn()
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) and "busy" not in str(e) or i == attempts - 1:
                    raise
                time.sleep(min(0.5, 0.01 * 2 ** min(i, 6)))

    def _conn(self) -> sqlite3.Connection:
        c = getattr(self._local, "conn", None)
        if c is None:
            c = sqlite3.connect(str(self.path), timeout=60.0, isolation_level=None)
            c.execute("PRAGMA busy_timeout=60000")
            self._retry(lambda: c.execute("PRAGMA journal_mode=WAL"))
            c.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = c
        return c

    def get(self, key: str) -> ChatResult | None:
        """The stored answer, or None. Failures are never served (a file written before that rule
        may hold some): a failed request is asked again."""
        row = self._retry(lambda: self._conn().execute(
            "SELECT payload FROM responses WHERE key=? AND status!='failed'", (key,)).fetchone())
        if row:
            self._mark_used(key)
        return ChatResult.from_json(json.loads(row[0])) if row else None

    def _mark_used(self, key: str) -> None:
        stage = os.environ.get(STAGE_ENV)
        if stage:
            self._retry(lambda: self._conn().execute("INSERT OR IGNORE INTO used VALUES (?,?)", (key, stage)))

    def used_count(self, stage: str) -> int:
        """How many answers `stage` used in its last run."""
        return self._retry(lambda: self._conn().execute("SELECT COUNT(*) FROM used WHERE stage=?",
                                                        (stage,)).fetchone()[0])

    def clear_used(self, stage: str) -> None:
        """Forget which answers `stage` used (its rerun marks them again)."""
        self._retry(lambda: self._conn().execute("DELETE FROM used WHERE stage=?", (stage,)))

    def export(self, out: str | Path, keep: bool = False) -> int:
        """Write the answers some stage's last run used as gzipped JSON lines sorted by key (key, model,
        status, payload; no timestamps: the same answers give the same bytes), atomically. Returns the count.
        The payload keeps its keys' order: a parsed answer is read back exactly as it was given, so a prompt
        built from it (the debate's judge reads the debaters' parsed answers) is the one first asked.
        `keep`: the answers already in `out` stay beside them (a key in both keeps the line already there).
        Keys name the trained models by their weights, so a CPU of another kind, whose floats train other
        weights, asks other keys: kept side by side, each kind of machine replays its own."""
        rows = self._retry(lambda: self._conn().execute(
            "SELECT key, model, status, payload FROM responses WHERE status!='failed' AND key IN "
            "(SELECT key FROM used) ORDER BY key").fetchall())
        root = str(ROOT) + "/"
        lines = {key: json.dumps({"key": key, "model": model, "status": status, "payload": json.loads(payload)},
                                 ensure_ascii=True).replace(root, "")     # answers are found by key: paths made relative
                 for key, model, status, payload in rows}
        if keep and Path(out).exists():       # checked as an import is: a damaged file is an error, never half-kept
            kept = read_exported(out, allow_empty=True)
            lines.update({key: json.dumps({"key": key, "model": model, "status": status, "payload": json.loads(payload)},
                                          ensure_ascii=True) for key, (model, status, payload) in kept.items()})
        buf = io.BytesIO()
        with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz:
            for key in sorted(lines):
                gz.write((lines[key] + "\n").encode("ascii"))
        write_bytes(out, buf.getvalue())
        return len(lines)

    def import_answers(self, src: str | Path) -> int:
        """Load exported answers (export's file) that this cache lacks; returns how many were added. The file
        is read whole and checked first (`read_exported`): any fault is one CacheError naming the file, the
        line and the field, and nothing of that file is kept (the cache is not touched)."""
        return self.import_rows(read_exported(src))

    def import_rows(self, answers: dict[str, tuple[str, str, str]]) -> int:
        """Add `read_exported`'s answers that this cache lacks, in one transaction; returns how many were added."""
        rows = [(key, model, status, payload) for key, (model, status, payload) in answers.items()]
        c = self._conn()

        def insert() -> int:
            before = c.total_changes
            c.execute("BEGIN IMMEDIATE")
            try:
                c.executemany("INSERT OR IGNORE INTO responses VALUES (?,?,?,0,?)", rows)
                c.execute("COMMIT")
            except BaseException:
                c.execute("ROLLBACK")
                raise
            return c.total_changes - before
        return self._retry(insert)

    def put(self, key: str, result: ChatResult) -> bool:
        """Store an answer (ok, unparseable, refused, blocked: each is what the model said).
        A failure (server down, key revoked, retries exhausted) is not stored. Returns whether it was."""
        if result.status == "failed":
            return False
        # ASCII-escaped: any string a server can send (a lone surrogate too) is storable and reads back as sent
        payload = json.dumps(result.to_json(), ensure_ascii=True)
        c = self._conn()
        self._retry(lambda: c.execute(
            "INSERT INTO responses VALUES (?,?,?,?,?) ON CONFLICT(key) DO UPDATE SET "
            "status=excluded.status, created=excluded.created, payload=excluded.payload "
            "WHERE responses.status='failed'", (key, result.model, result.status, time.time(), payload)))
        self._mark_used(key)
        return True

    # -- single flight: one caller per key at a time, across threads and processes
    CLAIM_TTL_S = 900.0          # a claim older than this is taken over (its owner hung or lost its host)

    @staticmethod
    def owner() -> str:
        return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"

    def claim(self, key: str) -> bool:
        """Claim the right to ask for `key`. False when another live caller holds it. A claim whose
        owner process is gone (same host) or that is older than CLAIM_TTL_S is taken over."""
        me, c = self.owner(), self._conn()

        def attempt() -> bool:
            c.execute("BEGIN IMMEDIATE")
            try:
                row = c.execute("SELECT owner, ts FROM claims WHERE key=?", (key,)).fetchone()
                if row is not None and row[0] != me and not self._stale(row[0], row[1]):
                    c.execute("COMMIT")
                    return False
                c.execute("INSERT OR REPLACE INTO claims VALUES (?,?,?)", (key, me, time.time()))
                c.execute("COMMIT")
                return True
            except BaseException:
                c.execute("ROLLBACK")
                raise
        return self._retry(attempt)

    def _stale(self, owner: str, ts: float) -> bool:
        if time.time() - ts > self.CLAIM_TTL_S:
            return True
        host, pid, _ = (owner.split(":") + ["", "", ""])[:3]
        if host == socket.gethostname() and pid.isdigit():
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                return False
        return False

    def release(self, key: str) -> None:
        me = self.owner()
        self._retry(lambda: self._conn().execute("DELETE FROM claims WHERE key=? AND owner=?", (key, me)))

    def wait_for(self, key: str, poll_s: float = 0.05) -> ChatResult | None:
        """Wait while another caller holds `key`: its answer, or None once the claim is gone without
        one (that caller failed) or went stale, so the waiter may claim the key itself."""
        while True:
            hit = self.get(key)
            if hit is not None:
                return hit
            row = self._retry(lambda: self._conn().execute("SELECT owner, ts FROM claims WHERE key=?",
                                                           (key,)).fetchone())
            if row is None or self._stale(row[0], row[1]):
                return self.get(key)
            time.sleep(poll_s)

    def __len__(self) -> int:
        return self._conn().execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def counts(self) -> dict[str, int]:
        return dict(self._conn().execute("SELECT status, COUNT(*) FROM responses GROUP BY status").fetchall())


#: a cache key: the sha256 of the request (lib.models.chat.messages.cache_key)
KEY = re.compile(r"[0-9a-f]{64}")
#: what an exported line holds, and what its payload holds (ChatResult.to_json), with the types each field may take
LINE_FIELDS = ("key", "model", "status", "payload")
PAYLOAD_FIELDS: dict[str, tuple[type, ...]] = {
    "text": (str,), "status": (str,), "usage": (dict,), "cost_usd": (int, float), "finish_reason": (str, type(None)),
    "error": (str, type(None)), "model": (str,), "attempts": (int,), "parsed": (object,), "latency_s": (int, float)}
#: the first bytes of a gzip file, and of the small text files a mirror or large-file tool leaves in a file's place
GZIP_MAGIC = b"\x1f\x8b"
POINTERS = {b"version https://git-lfs": "a Git LFS pointer (run `git lfs pull` to fetch the file itself)",
            b"/annex/objects/": "a git-annex pointer (run `git annex get` to fetch the file itself)",
            b"../.git/annex/": "a git-annex pointer (run `git annex get` to fetch the file itself)"}


def read_exported(src: str | Path, allow_empty: bool = False) -> dict[str, tuple[str, str, str]]:
    """The answers of an exported file (`ResponseCache.export`): key -> (model, status, payload as JSON text),
    every line checked before any is used. Raises CacheError naming the file, the line and the field for: a
    file that is not gzip (plain text, a Git LFS or git-annex pointer left in its place), a truncated or
    corrupted gzip stream (a cut download, a wrong CRC), bytes that are not ASCII, a line that is not a JSON
    object of exactly key, model, status and payload, a key that is not a request hash (64 hex digits), a
    status that is not a stored one, a payload that is not a ChatResult (unknown or missing fields, a field of
    the wrong type), a payload whose model or status differs from its line's (an answer filed under another
    model), and the same key twice with different answers (which line won would be an accident of order).
    An empty file (no answers: 0 bytes, or a gzip of nothing) is an error unless `allow_empty`: where a
    profile's committed answers should be, it means they are lost, and a run would ask every model afresh."""
    src = Path(src)
    where = relpath(Path(os.path.abspath(src)).parent) + "/" + src.name      # the link's own name, not its target's
    if src.is_symlink() and not src.exists():
        target = os.readlink(src)
        kind = "a git-annex pointer (run `git annex get` to fetch the file itself)" if "annex" in target else "a link"
        raise CacheError(f"{where}: is {kind} to {target}, which is absent, not the gzipped answers")
    try:
        raw = src.read_bytes()
    except OSError as e:
        raise CacheError(f"{where}: cannot be read ({e.strerror or e})") from None
    if not raw:
        if allow_empty:
            return {}
        raise CacheError(f"{where}: the file is empty (0 bytes), where the committed model answers should be; "
                         f"restore it (git checkout -- {where}) or regenerate it with `make reproduce COLD=1`")
    if raw[:2] != GZIP_MAGIC:
        kind = next((what for head, what in POINTERS.items() if head in raw[:200]), None)
        if kind:
            raise CacheError(f"{where}: is {kind}, not the gzipped answers")
        raise CacheError(f"{where}: is not a gzip file (it starts with {raw[:16]!r}); the committed answers are "
                         f"gzipped JSON lines (lib.models.chat.cache.export)")
    try:
        text = gzip.decompress(raw)
    except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as e:
        raise CacheError(f"{where}: the gzip stream is damaged ({type(e).__name__}: {e}): a cut-short or corrupted "
                         f"copy; restore it (git checkout -- {where}) or regenerate it with `make reproduce COLD=1`") from None
    out: dict[str, tuple[str, str, str]] = {}
    first_line: dict[str, int] = {}
    for n, bline in enumerate(text.split(b"\n"), 1):
        if not bline.strip():
            continue
        at = f"{where}: line {n}"
        try:
            line = bline.decode("ascii")
        except UnicodeDecodeError as e:
            raise CacheError(f"{at}: byte {e.start + 1} is not ASCII (the export escapes every other character)") from None
        try:
            r = loads_strict(line, at, error=CacheError)
        except json.JSONDecodeError as e:
            raise CacheError(f"{at}: not JSON (column {e.colno}: {e.msg})") from None
        if not isinstance(r, dict):
            raise CacheError(f"{at}: a JSON {type(r).__name__}, not an exported answer (an object of "
                             f"{', '.join(LINE_FIELDS)})")
        missing = [k for k in LINE_FIELDS if k not in r]
        extra = sorted(set(r) - set(LINE_FIELDS))
        if missing or extra:
            raise CacheError(f"{at}: " + (f"field {missing[0]!r} is missing" if missing else f"unknown field {extra[0]!r}")
                             + f" (an exported answer has exactly {', '.join(LINE_FIELDS)})")
        key, model, status, payload = (r[k] for k in LINE_FIELDS)
        if not isinstance(key, str) or not KEY.fullmatch(key):
            raise CacheError(f"{at}: field 'key' is {key!r}, not a cache key (the request's sha256: 64 hex digits)")
        if not isinstance(model, str) or not model:
            raise CacheError(f"{at}: field 'model' is {model!r}, not a model's name")
        if status not in STATUSES or status == "failed":
            raise CacheError(f"{at}: field 'status' is {status!r}, not a stored one "
                             f"({', '.join(s for s in STATUSES if s != 'failed')})")
        if not isinstance(payload, dict):
            raise CacheError(f"{at}: field 'payload' is a JSON {type(payload).__name__}, not an answer object")
        for k in payload:
            if k not in PAYLOAD_FIELDS:
                raise CacheError(f"{at}: field 'payload.{k}' is not a field of an answer "
                                 f"({', '.join(PAYLOAD_FIELDS)})")
        for k, types in PAYLOAD_FIELDS.items():
            if k not in payload:
                raise CacheError(f"{at}: field 'payload.{k}' is missing")
            v = payload[k]
            if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
                raise CacheError(f"{at}: field 'payload.{k}' is {v!r}, expected "
                                 f"{' or '.join('null' if t is type(None) else t.__name__ for t in types)}")
        if payload["model"] != model:
            raise CacheError(f"{at}: field 'model' is {model!r} but its answer's 'payload.model' is "
                             f"{payload['model']!r}: an answer filed under another model")
        if payload["status"] != status:
            raise CacheError(f"{at}: field 'status' is {status!r} but its answer's 'payload.status' is "
                             f"{payload['status']!r}")
        entry = (model, status, json.dumps(payload, ensure_ascii=True))
        if key in out and out[key] != entry:
            raise CacheError(f"{at}: field 'key' {key[:16]}... repeats line {first_line[key]} with a different "
                             f"answer (which one a replay read would be an accident of order)")
        out.setdefault(key, entry)
        first_line.setdefault(key, n)
    if not out and not allow_empty:
        raise CacheError(f"{where}: holds no answers, where the committed model answers should be; restore it "
                         f"(git checkout -- {where}) or regenerate it with `make reproduce COLD=1`")
    return out


def default_cache_path(profile: str) -> Path:
    """Where a profile's response cache lives."""
    return ROOT / "artifacts" / profile / "cache" / "responses.sqlite"
