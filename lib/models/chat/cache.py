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
import socket
import sqlite3
import threading
import time
from pathlib import Path

from lib import ROOT
from lib.models.chat.messages import ChatResult
from lib.compendium.artifacts import write_bytes

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
        if keep and Path(out).exists():
            with gzip.open(out, "rt", encoding="ascii") as f:
                lines.update({json.loads(ln)["key"]: ln.rstrip("\n") for ln in f if ln.strip()})
        buf = io.BytesIO()
        with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz:
            for key in sorted(lines):
                gz.write((lines[key] + "\n").encode("ascii"))
        write_bytes(out, buf.getvalue())
        return len(lines)

    def import_answers(self, src: str | Path) -> int:
        """Load exported answers (export's file) that this cache lacks; returns how many were added.
        A malformed line is an error naming the file and line (nothing of that file is kept then)."""
        src = Path(src)
        rows = []
        with gzip.open(src, "rt", encoding="ascii") as f:
            for n, line in enumerate(f, 1):
                try:
                    r = json.loads(line)
                    rows.append((r["key"], r["model"], r["status"], json.dumps(r["payload"], ensure_ascii=True)))
                    ChatResult.from_json(r["payload"])
                except (ValueError, KeyError, TypeError) as e:
                    raise CacheError(f"{src}: line {n} is not an exported answer ({type(e).__name__}: {e}); "
                                     f"regenerate it with `make reproduce COLD=1`") from None
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


def default_cache_path(profile: str) -> Path:
    """Where a profile's response cache lives."""
    return ROOT / "artifacts" / profile / "cache" / "responses.sqlite"
