"""Generative chat models behind one protocol and one response cache.

    chat = load_chat("memeworld-vlm", cache="artifacts/embedded/cache/responses.sqlite")
    r = chat.generate([user(image, "Describe the image.")], GenParams(max_new_tokens=40))
    r.text, r.status, r.usage, r.cost_usd

Messages are `{"role": ..., "content": [parts]}` with parts `{"type": "text", "text": ...}` or
`{"type": "image", "image": PIL.Image | path | bytes}`, interleaved freely (few-shot prompts
put several images in one conversation). Every backend returns a `ChatResult` with the text,
a status (`ok`, `refused`, `blocked`, `failed`), token usage and cost.

Backends:
- `HFChatBackend`: a local or hub Hugging Face image-text-to-text model through
  `AutoModelForImageTextToText` and its processor's chat template (InternVL3.5, Pixtral,
  Qwen2.5-VL, PaliGemma, and the compendium's own memeworld-vlm);
- `OpenAICompatibleBackend`: any `/v1/chat/completions` endpoint (OpenAI, Gemini's and
  Qwen's compatible endpoints, vLLM, Ollama, LM Studio) with timeouts, retries with
  backoff on 429/5xx/timeouts/malformed bodies honouring Retry-After, key rotation over
  NAME, NAME_1, NAME_2... from the environment or a git-ignored `.env`, refusals and
  safety blocks recorded as such, token usage and cost counted.

`Chat` puts the one `ResponseCache` (SQLite) in front of a backend: the key hashes the
model's identity and revision (an HTTP model's endpoint too), the messages (images by their
bytes) and the decoding parameters (a JSON schema or choice list included), never a key or a
header. Each answer is stored the moment it arrives, so a rerun costs zero calls and a crash
loses nothing already answered. What the model said is stored whatever it was (ok,
unparseable, refused, blocked); a failed request is not, and is asked again next time.
Requests are single-flight per key: a caller claims the key in the cache file before asking,
and any other thread or process asking for the same key waits for that answer, so it is paid
for once and every caller gets the same one.
"""
from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import itertools
import json
import os
import random
import re
import socket
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from lib import ROOT
from lib.presets import Preset, PresetError, get_preset, torch_dtype

STATUSES = ("ok", "unparseable", "refused", "blocked", "failed")
PROMPTS_DIR = ROOT / "params" / "prompts"


# ----------------------------------------------------------------------------- messages
@dataclass(frozen=True)
class GenParams:
    """Decoding parameters; part of the cache key (the schema and choices too)."""
    temperature: float = 0.0
    max_new_tokens: int = 256
    seed: int = 0
    top_p: float = 1.0
    json_mode: bool = False      # ask an HTTP endpoint for a JSON object (response_format)
    json_schema: Any = field(default=None, hash=False)   # a JSON Schema the answer must match
    choices: tuple[str, ...] | None = None                # or: the answer is one of these strings

    def __post_init__(self):
        if self.choices is not None:
            object.__setattr__(self, "choices", tuple(str(c) for c in self.choices))
            if not self.choices:
                raise ValueError("GenParams.choices must hold at least one choice")
        if self.json_schema is not None and self.choices is not None:
            raise ValueError("GenParams takes a json_schema or choices, not both")
        if self.json_schema is not None and not isinstance(self.json_schema, dict):
            raise ValueError(f"GenParams.json_schema must be a JSON Schema object (dict), "
                             f"got {type(self.json_schema).__name__}")

    @property
    def structured(self) -> bool:
        return self.json_schema is not None or self.choices is not None

    def schema(self) -> dict[str, Any] | None:
        """The JSON Schema sent to the server: `json_schema`, or for `choices` an object with one
        enum-valued field `answer` (OpenAI's structured output needs an object at the top)."""
        if self.json_schema is not None:
            return self.json_schema
        if self.choices is not None:
            return {"type": "object", "properties": {"answer": {"type": "string", "enum": list(self.choices)}},
                    "required": ["answer"], "additionalProperties": False}
        return None


@dataclass
class ChatResult:
    text: str
    status: str = "ok"                       # ok | refused | blocked | failed
    usage: dict[str, int] = field(default_factory=lambda: {"prompt_tokens": 0, "completion_tokens": 0})
    cost_usd: float = 0.0
    finish_reason: str | None = None
    error: str | None = None
    model: str = ""
    attempts: int = 1
    parsed: Any = None                       # structured requests: the decoded object (choices: the choice)
    latency_s: float = 0.0                   # wall time of the call(s) that produced it
    from_cache: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("from_cache")
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "ChatResult":
        return cls(**{**d, "from_cache": True})


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


def image(img) -> dict[str, Any]:
    return {"type": "image", "image": img}


def user(*parts) -> dict[str, Any]:
    """A user turn; strings become text parts, anything else an image part."""
    return {"role": "user", "content": [p if isinstance(p, dict) else (text(p) if isinstance(p, str) else image(p))
                                        for p in parts]}


def assistant(t: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [text(t)]}


def system(t: str) -> dict[str, Any]:
    return {"role": "system", "content": [text(t)]}


def image_bytes(img) -> bytes:
    """The bytes that identify an image part: file bytes for paths and bytes, PNG for PIL images."""
    if isinstance(img, (bytes, bytearray)):
        return bytes(img)
    if isinstance(img, (str, Path)):
        return Path(img).read_bytes()
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _parts(msg: dict[str, Any]) -> list[dict[str, Any]]:
    c = msg.get("content")
    if isinstance(c, str):
        return [text(c)]
    if not isinstance(c, list):
        raise ValueError(f"message content must be a string or a list of parts, got {type(c).__name__}")
    return c


def canonical(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages with every image replaced by the sha256 of its bytes (for cache keys)."""
    out = []
    for i, m in enumerate(messages):
        if "role" not in m:
            raise ValueError(f"message {i} has no 'role'")
        parts = []
        for p in _parts(m):
            if p.get("type") == "image":
                parts.append({"type": "image", "sha256": hashlib.sha256(image_bytes(p["image"])).hexdigest()})
            elif p.get("type") == "text":
                parts.append({"type": "text", "text": p["text"]})
            else:
                raise ValueError(f"message {i}: unknown part type {p.get('type')!r} (text or image)")
        out.append({"role": m["role"], "content": parts})
    return out


def cache_key(identity: dict[str, Any], messages: Sequence[dict[str, Any]], params: GenParams) -> str:
    blob = json.dumps({"model": identity, "messages": canonical(messages), "params": asdict(params)},
                      sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


# ----------------------------------------------------------------------------- structured output
def prompt_template(relpath: str) -> str:
    """A prompt template file under params/prompts/ (prompts are data, never strings in code)."""
    path = PROMPTS_DIR / relpath
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"prompt template {path.relative_to(ROOT)} does not exist") from None


#: Answers longer than this are not read as JSON (no answer of a max_new_tokens-bounded call comes near).
MAX_JSON_CHARS = 200_000
#: Deeper nesting than this is refused before any decoding (no schema here nests past 5 levels).
MAX_JSON_DEPTH = 64
_JSON_SPECIAL = re.compile(r'[{}\[\]"\\]')


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(f"duplicate key {k!r} in a JSON object")
        out[k] = v
    return out


class _DuplicateKey(ValueError):
    pass


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    v = float(text)
    if v != v or v in (float("inf"), float("-inf")):
        raise ValueError(f"{text} is not a finite number")
    return v


def loads_strict(text: str) -> Any:
    """json.loads that refuses what a schema cannot mean: duplicate keys, NaN / Infinity, numbers
    that overflow to infinity, and nesting past MAX_JSON_DEPTH. Any failure is a ValueError."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise ValueError("nested deeper than the decoder allows") from None


def _object_spans(t: str) -> list[tuple[int, int]]:
    """The balanced {...} spans of `t` in order of their opening brace, in one pass: brackets are
    matched and double-quoted strings skipped only inside brackets (quotes in prose do not count);
    a mismatched closing bracket resets the matcher. Raises ValueError past MAX_JSON_DEPTH."""
    spans: list[tuple[int, int]] = []
    stack: list[tuple[str, int]] = []
    in_string, skip = False, -1
    for m in _JSON_SPECIAL.finditer(t):
        i, ch = m.start(), m.group()
        if i <= skip:
            continue
        if in_string:
            if ch == "\\":
                skip = i + 1                   # the escaped character
            elif ch == '"':
                in_string = False
            continue
        if ch == '"':
            in_string = bool(stack)
        elif ch in "{[":
            stack.append((ch, i))
            if len(stack) > MAX_JSON_DEPTH:
                raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
        elif ch in "}]":
            if stack and stack[-1][0] == ("{" if ch == "}" else "["):
                opener, start = stack.pop()
                if opener == "{":
                    spans.append((start, i + 1))
            else:
                stack.clear()
    return sorted(spans)


def check_json_bounds(text: str) -> None:
    """ValueError when an answer is too long or nested too deep to be read as JSON (the bounds
    every reader here applies before decoding, so that reading is linear in the answer's length)."""
    if len(text) > MAX_JSON_CHARS:
        raise ValueError(f"the answer is {len(text):,} characters long; at most {MAX_JSON_CHARS:,} are read as JSON")
    _object_spans(text)


def extract_json(text: str) -> Any:
    """The JSON value in an answer: the whole text, else its first balanced {...} block that
    decodes (models often wrap JSON in prose or code fences). Total and linear in the answer's
    length: a ValueError (never another exception) when there is none, when a key repeats, when a
    number is not finite, when nesting passes MAX_JSON_DEPTH or the answer MAX_JSON_CHARS."""
    t = (text if isinstance(text, str) else "").strip()
    if len(t) > MAX_JSON_CHARS:
        raise ValueError(f"the answer is {len(t):,} characters long; at most {MAX_JSON_CHARS:,} are read as JSON")
    spans = _object_spans(t)                   # also the depth check, before any decoding
    try:
        return loads_strict(t)
    except _DuplicateKey:
        raise
    except ValueError:
        pass
    # nested spans are each at most MAX_JSON_DEPTH deep, so all of them together are O(depth x length)
    for start, end in spans:
        try:
            return loads_strict(t[start:end])
        except _DuplicateKey:
            raise
        except ValueError:
            continue
    raise ValueError("no JSON object in the answer")


def parse_structured(text: str, params: GenParams) -> tuple[Any, str | None]:
    """(parsed value, None) when the answer matches the request's schema / choices, else (None, why).

    For `choices` the value is the chosen string; a bare answer equal to one choice (case and
    surrounding punctuation ignored) is accepted too, as models without constrained decoding give it.
    """
    import jsonschema
    schema = params.schema()
    try:
        value = extract_json(text)
    except ValueError as e:
        if params.choices is not None:
            bare = (text or "").strip().strip(".!\"'` ").lower()
            hits = [c for c in params.choices if c.lower() == bare]
            if len(hits) == 1:
                return hits[0], None
        return None, str(e)
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as e:
        where = "/".join(str(x) for x in e.absolute_path) or "the top level"
        return None, f"{e.message} (at {where})"
    return (value["answer"] if params.choices is not None else value), None


def with_schema_instruction(messages: Sequence[dict[str, Any]], params: GenParams) -> list[dict[str, Any]]:
    """The conversation with the schema instruction appended to its last user turn (for backends
    without constrained decoding)."""
    instr = prompt_template("structured/instruction.txt").format(
        schema=json.dumps(params.schema(), ensure_ascii=False))
    out = [dict(m) for m in messages]
    last = max((i for i, m in enumerate(out) if m["role"] == "user"), default=None)
    if last is None:
        return out + [user(instr)]
    out[last] = {**out[last], "content": _parts(out[last]) + [text("\n\n" + instr)]}
    return out


_SURROGATE = re.compile(r"[\ud800-\udfff]")


def clean_text(value: Any) -> str:
    """A model's text as every later step can store and encode: a lone UTF-16 surrogate (which a
    server can send as a JSON escape) becomes U+FFFD; a missing text becomes ''."""
    if not isinstance(value, str):
        return "" if value is None else str(value)
    return _SURROGATE.sub("\ufffd", value)


def _storable(r: ChatResult) -> ChatResult:
    r.text = clean_text(r.text)
    if r.error is not None:
        r.error = clean_text(r.error)
    return r


# ----------------------------------------------------------------------------- cache
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
        return ChatResult.from_json(json.loads(row[0])) if row else None

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


# ----------------------------------------------------------------------------- protocol
class ChatBackend(Protocol):
    """What a chat backend provides. Optional: `complete_batch(conversations, params)` (local models
    generating several conversations in one call) and `native_schema` (True when the backend
    constrains decoding to `params.schema()` itself, as llama.cpp, vLLM and OpenAI do)."""

    def identity(self) -> dict[str, Any]: ...          # model id + revision (+ weights digest): cache key

    def complete(self, messages: Sequence[dict[str, Any]], params: GenParams) -> ChatResult: ...


@dataclass
class ChatStats:
    requests: int = 0          # requests that reached the backend (a structured retry counts as one more)
    cache_hits: int = 0
    failed: int = 0
    refused: int = 0           # refused or blocked
    unparseable: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0     # prompt tokens the server took from its prefix cache
    cost_usd: float = 0.0


def _add_usage(into: ChatResult, other: ChatResult) -> None:
    for k, v in other.usage.items():
        into.usage[k] = into.usage.get(k, 0) + v
    into.cost_usd += other.cost_usd
    into.attempts += other.attempts
    into.latency_s += other.latency_s


class Chat:
    """A backend behind the response cache, with batching over a bounded thread pool.

    Structured requests (`GenParams.json_schema` / `choices`): a backend with `native_schema`
    gets the schema (constrained decoding) and its answer is validated; any other backend gets
    the schema as an instruction (params/prompts/structured/) and, when the answer does not
    parse or validate, up to `schema_retries` follow-up turns quoting the error. An answer that
    still does not match is returned with status `unparseable` (and cached: it is an answer).
    """

    def __init__(self, backend: ChatBackend, cache: ResponseCache | str | Path | None = None,
                 max_workers: int = 4, name: str = "", batch_size: int = 1, schema_retries: int = 2):
        self.backend = backend
        self.cache = ResponseCache(cache) if isinstance(cache, (str, Path)) else cache
        self.max_workers = max_workers
        self.batch_size = batch_size          # > 1: local backends generate this many conversations per call
        self.schema_retries = schema_retries
        self.name = name
        self.stats = ChatStats()
        self._lock = threading.Lock()

    @property
    def native_schema(self) -> bool:
        return bool(getattr(self.backend, "native_schema", False))

    def key(self, messages, params: GenParams) -> str:
        ident = self.backend.identity()
        if params.structured and not self.native_schema:
            # the prompt-side instruction and the retry policy shape the answer: part of the key
            ident = {**ident, "structured": {"instruction": prompt_template("structured/instruction.txt"),
                                             "retry": prompt_template("structured/retry.txt"),
                                             "retries": self.schema_retries}}
        return cache_key(ident, messages, params)

    def _lookup(self, key: str) -> ChatResult | None:
        return None if self.cache is None else self.cache.get(key)

    # -- one round trip to the backend, batched where the backend can
    def _raw(self, conversations: Sequence[Sequence[dict[str, Any]]], params: GenParams) -> list[ChatResult]:
        with self._lock:
            self.stats.requests += len(conversations)
        t0 = time.perf_counter()
        if hasattr(self.backend, "complete_batch") and len(conversations) > 1:
            out = self.backend.complete_batch(conversations, params)
            for r in out:
                r.latency_s = r.latency_s or (time.perf_counter() - t0)
            return [_storable(r) for r in out]
        out = []
        for m in conversations:
            t1 = time.perf_counter()
            r = self.backend.complete(m, params)
            r.latency_s = r.latency_s or (time.perf_counter() - t1)
            out.append(_storable(r))
        return out

    def _answer(self, conversations: Sequence[Sequence[dict[str, Any]]], params: GenParams) -> list[ChatResult]:
        """Answers for a chunk of conversations, structured output handled (see the class docstring)."""
        if not params.structured:
            return self._raw(conversations, params)
        if self.native_schema:
            res = self._raw(conversations, params)
            for r in res:
                self._check(r, params)
            return res
        convs = [with_schema_instruction(m, params) for m in conversations]
        res = self._raw(convs, params)
        errors = [self._check(r, params) for r in res]
        for _ in range(self.schema_retries):
            bad = [i for i, e in enumerate(errors) if e is not None]
            if not bad:
                break
            retry = prompt_template("structured/retry.txt")
            for i in bad:
                convs[i] = list(convs[i]) + [assistant(res[i].text), user(retry.format(error=errors[i]))]
            again = self._raw([convs[i] for i in bad], params)
            for i, r in zip(bad, again):
                _add_usage(r, res[i])
                res[i], errors[i] = r, self._check(r, params)
        return res

    @staticmethod
    def _check(r: ChatResult, params: GenParams) -> str | None:
        """Parse an ok answer against the request's schema; mark it unparseable when it does not match."""
        if r.status not in ("ok", "unparseable"):
            return None
        try:
            r.parsed, err = parse_structured(r.text, params)
        except Exception as e:  # noqa: BLE001 - no answer, however hostile, may stop a run
            r.parsed, err = None, f"the answer could not be checked ({type(e).__name__}: {str(e)[:200]})"
        if err is not None and r.finish_reason == "length":
            err = f"the answer was cut off at max_new_tokens={params.max_new_tokens} ({err})"
        r.status = "ok" if err is None else "unparseable"
        if err is not None:
            r.error = f"answer does not match the schema: {err}"
        return err

    def _store(self, key: str, res: ChatResult) -> None:
        if self.cache is not None:
            self.cache.put(key, res)
        with self._lock:
            self.stats.failed += res.status == "failed"
            self.stats.refused += res.status in ("refused", "blocked")
            self.stats.unparseable += res.status == "unparseable"
            self.stats.prompt_tokens += res.usage.get("prompt_tokens", 0)
            self.stats.completion_tokens += res.usage.get("completion_tokens", 0)
            self.stats.cached_tokens += res.usage.get("cached_tokens", 0)
            self.stats.cost_usd += res.cost_usd

    def _call(self, key: str, messages, params: GenParams) -> ChatResult:
        """Ask for one key, single-flight: while another thread or process asks for the same key,
        wait for its answer instead of paying for it again."""
        if self.cache is None:
            res = self._answer([messages], params)[0]
            self._store(key, res)
            return res
        while True:
            if self.cache.claim(key):
                try:
                    hit = self.cache.get(key)           # answered between our lookup and our claim
                    if hit is not None:
                        with self._lock:
                            self.stats.cache_hits += 1
                        return hit
                    res = self._answer([messages], params)[0]
                    self._store(key, res)
                    return res
                finally:
                    self.cache.release(key)
            hit = self.cache.wait_for(key)
            if hit is not None:
                with self._lock:
                    self.stats.cache_hits += 1
                return hit

    def generate(self, messages: Sequence[dict[str, Any]], params: GenParams = GenParams()) -> ChatResult:
        key = self.key(messages, params)
        hit = self._lookup(key)
        if hit is not None:
            with self._lock:
                self.stats.cache_hits += 1
            return hit
        return self._call(key, messages, params)

    def generate_many(self, conversations: Sequence[Sequence[dict[str, Any]]], params: GenParams = GenParams(),
                      max_workers: int | None = None, desc: str | None = None,
                      progress: bool = True) -> list[ChatResult]:
        """Answers in input order. Cached answers are replayed, identical requests sent once,
        the rest run on a bounded pool (an HTTP server batches the requests in flight) or, for
        local models, in batches; each answer is cached as soon as it arrives."""
        from tqdm.auto import tqdm
        keys = [self.key(m, params) for m in conversations]
        results: dict[str, ChatResult] = {}
        todo: dict[str, Sequence[dict[str, Any]]] = {}
        for k, m in zip(keys, conversations):
            if k in results or k in todo:
                continue
            hit = self._lookup(k)
            if hit is not None:
                results[k] = hit
                self.stats.cache_hits += 1
            else:
                todo[k] = m
        if todo and hasattr(self.backend, "prepare"):
            self.backend.prepare(list(todo.values()))     # e.g. caption every image in one batched pass
        bar = tqdm(total=len(todo), desc=desc or f"chat {self.name}".strip(), disable=not progress or not todo)
        if hasattr(self.backend, "complete_batch") and self.batch_size > 1:
            # local models: batched generation, each batch's answers cached as it finishes; keys another
            # caller is asking for are left to it and collected at the end (single flight)
            items = list(todo.items())
            elsewhere = []
            try:
                for s in range(0, len(items), self.batch_size):
                    chunk = items[s:s + self.batch_size]
                    if self.cache is not None:
                        mine = [(k, m) for k, m in chunk if self.cache.claim(k)]
                        owned = {k for k, _ in mine}
                        elsewhere += [(k, m) for k, m in chunk if k not in owned]
                    else:
                        mine = chunk
                    try:
                        for (k, _), res in zip(mine, self._answer([m for _, m in mine], params) if mine else []):
                            self._store(k, res)
                            results[k] = res
                    finally:
                        for k, _ in mine if self.cache is not None else []:
                            self.cache.release(k)
                    bar.update(len(mine))
                for k, m in elsewhere:
                    results[k] = self._call(k, m, params)
                    bar.update(1)
            finally:
                bar.close()
            return [results[k] for k in keys]
        workers = max(1, min(max_workers or self.max_workers, len(todo) or 1))
        pool = ThreadPoolExecutor(max_workers=workers)
        try:
            futs = {pool.submit(self._call, k, m, params): k for k, m in todo.items()}
            for fut in as_completed(futs):
                results[futs[fut]] = fut.result()
                bar.update(1)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            bar.close()
        return [results[k] for k in keys]

# ----------------------------------------------------------------------------- API keys
def read_dotenv(path: str | Path) -> dict[str, str]:
    """KEY=VALUE lines of a .env file (comments and `export ` allowed; quotes stripped)."""
    out: dict[str, str] = {}
    p = Path(path)
    if not p.exists():
        return out
    for line in p.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        if line.startswith("export "):
            line = line[len("export "):]
        k, v = line.split("=", 1)
        out[k.strip()] = v.strip().strip("'\"")
    return out


#: Every env file other than the project's `.env` that keys were read from, one absolute path a line:
#: the notebook scrubber (lib.runner) redacts their secrets too, since it runs in another process.
ENV_FILES_LOG = ROOT / "artifacts" / ".env_files"


def remembered_env_files() -> list[Path]:
    try:
        return [Path(line) for line in ENV_FILES_LOG.read_text(encoding="utf-8").splitlines() if line.strip()]
    except OSError:
        return []


def _remember_env_file(path: str | Path) -> None:
    p = Path(path).resolve()
    if p == (ROOT / ".env").resolve() or p in remembered_env_files():
        return
    from lib.artifacts import write_text
    write_text(ENV_FILES_LOG, "".join(f"{f}\n" for f in [*remembered_env_files(), p]))


def api_keys(name: str, env_file: str | Path | None = None) -> list[str]:
    """NAME, then NAME_1, NAME_2, ... from the environment, falling back to `.env` (or `env_file`,
    which is then remembered so that saved notebooks are scrubbed of its secrets too)."""
    if env_file is not None:
        _remember_env_file(env_file)
    env = {**read_dotenv(env_file if env_file is not None else ROOT / ".env"), **os.environ}
    keys = [env[name]] if env.get(name) else []
    i = 1
    while env.get(f"{name}_{i}"):
        keys.append(env[f"{name}_{i}"])
        i += 1
    return list(dict.fromkeys(keys))


class KeyRing:
    """Round-robin over API keys; a key the server rejects (401/403) is retired."""

    def __init__(self, keys: Sequence[str]):
        self._keys = list(keys)
        self._dead: set[str] = set()
        self._cycle = itertools.cycle(range(len(self._keys))) if self._keys else None
        self._lock = threading.Lock()

    def next(self) -> str | None:
        with self._lock:
            if not self._keys:
                return None
            for _ in range(len(self._keys)):
                k = self._keys[next(self._cycle)]
                if k not in self._dead:
                    return k
            return None

    def retire(self, key: str) -> None:
        with self._lock:
            self._dead.add(key)

    @property
    def alive(self) -> int:
        return len([k for k in self._keys if k not in self._dead])


# ----------------------------------------------------------------------------- HTTP backend
RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
SAFETY_FINISH = ("content_filter", "safety", "SAFETY", "prohibited_content")
#: What providers put in an error body when a safety system stopped the request (a block, not a failure).
SAFETY_MARKERS = ("content_filter", "content_policy", "ResponsibleAIPolicyViolation", "SAFETY", "data_inspection_failed")


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        from email.utils import parsedate_to_datetime
        try:
            return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
        except (TypeError, ValueError):
            return None


class OpenAICompatibleBackend:
    """POST /chat/completions on any OpenAI-compatible server (OpenAI, vLLM, llama.cpp's server...).

    `structured_output`: "json_schema" sends a structured request's schema as OpenAI's
    `response_format: {"type": "json_schema", ...}` (the server constrains decoding: OpenAI,
    vLLM, llama.cpp); "prompt" leaves the schema to the prompt and the parse-and-retry path of
    `Chat`, for servers that lack it. `identity_extra` joins the cache identity (a served
    model's weights digest and engine, so the cache does not depend on its ephemeral port).
    """

    def __init__(self, model: str, base_url: str, keys: Sequence[str] = (), revision: str | None = None,
                 timeout_s: float = 60.0, max_retries: int = 5, backoff_s: float = 1.0, max_backoff_s: float = 60.0,
                 price_in: float = 0.0, price_out: float = 0.0, api_key_optional: bool = False,
                 sleep: Callable[[float], None] = time.sleep, structured_output: str = "json_schema",
                 identity_extra: dict[str, Any] | None = None, max_connections: int = 64,
                 total_timeout_s: float | None = None):
        import httpx
        if structured_output not in ("json_schema", "prompt"):
            raise PresetError(f"structured_output must be 'json_schema' or 'prompt', got {structured_output!r}")
        self.structured_output = structured_output
        self.native_schema = structured_output == "json_schema"
        self.identity_extra = dict(identity_extra or {})
        self.model = model
        self.revision = revision
        self.base_url = base_url.rstrip("/")
        self.keys = KeyRing(keys)
        if not keys and not api_key_optional:
            raise PresetError(f"no API key for {model} at {base_url}: set the environment variable (or .env entry) "
                              f"named by the preset's api_key_env, optionally NAME_1, NAME_2... for rotation")
        self.timeout_s = timeout_s          # one attempt, sending to last byte, however slowly the body trickles
        # one call, every retry and back-off included: repeated hangs end here (default: three attempts' worth)
        self.total_timeout_s = float(total_timeout_s) if total_timeout_s is not None else 3 * timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.price_in, self.price_out = price_in, price_out
        self._sleep = sleep
        self._client = httpx.Client(timeout=httpx.Timeout(timeout_s),
                                    limits=httpx.Limits(max_connections=max_connections,
                                                        max_keepalive_connections=max_connections))

    def identity(self) -> dict[str, Any]:
        """Model, revision and endpoint: two servers that share a model name are different models.
        A model served here names its weights' digest instead (its port changes every run)."""
        if self.identity_extra:
            return {"model": self.model, "revision": self.revision, "endpoint": "openai_compatible",
                    **self.identity_extra}
        return {"model": self.model, "revision": self.revision, "endpoint": "openai_compatible",
                "base_url": self.base_url}

    @staticmethod
    def _wire_messages(messages) -> list[dict[str, Any]]:
        out = []
        for m in messages:
            parts = []
            for p in _parts(m):
                if p["type"] == "text":
                    parts.append({"type": "text", "text": p["text"]})
                else:
                    b = image_bytes(p["image"])
                    mime = "image/jpeg" if b[:3] == b"\xff\xd8\xff" else "image/png"
                    if mime == "image/png" and not b.startswith(b"\x89PNG"):
                        from PIL import Image
                        buf = io.BytesIO()
                        Image.open(io.BytesIO(b)).save(buf, format="PNG")
                        b = buf.getvalue()
                    parts.append({"type": "image_url",
                                  "image_url": {"url": f"data:{mime};base64,{base64.b64encode(b).decode()}"}})
            if all(p["type"] == "text" for p in parts):
                out.append({"role": m["role"], "content": "".join(p["text"] for p in parts)})
            else:
                out.append({"role": m["role"], "content": parts})
        return out

    def _body(self, messages, params: GenParams) -> dict[str, Any]:
        body = {"model": self.model, "messages": self._wire_messages(messages), "temperature": params.temperature,
                "max_tokens": params.max_new_tokens, "seed": params.seed, "top_p": params.top_p}
        if params.structured and self.native_schema:
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "response", "schema": params.schema(), "strict": True}}
        elif params.json_mode:
            body["response_format"] = {"type": "json_object"}
        return body

    def _cost(self, usage: dict[str, int]) -> float:
        return (usage.get("prompt_tokens", 0) * self.price_in + usage.get("completion_tokens", 0) * self.price_out) / 1e6

    def _parse(self, data: dict[str, Any], attempts: int) -> ChatResult:
        choice = data["choices"][0]
        msg = choice.get("message") or {}
        u = data.get("usage") or {}
        details = u.get("prompt_tokens_details") or {}
        usage = {"prompt_tokens": int(u.get("prompt_tokens") or 0), "completion_tokens": int(u.get("completion_tokens") or 0),
                 "cached_tokens": int(details.get("cached_tokens") or 0)}
        finish = choice.get("finish_reason")
        content = msg.get("content")
        if content is None and not msg.get("refusal") and finish not in SAFETY_FINISH:
            raise ValueError("the answer has no content")     # malformed: retried, then failed (never 'ok')
        if isinstance(content, list):      # some servers answer with content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        res = ChatResult(text=content or "", usage=usage, cost_usd=self._cost(usage), finish_reason=finish,
                         model=self.model, attempts=attempts)
        if msg.get("refusal"):
            res.status, res.text, res.error = "refused", msg.get("content") or "", str(msg["refusal"])
        elif finish in SAFETY_FINISH:
            res.status, res.error = "blocked", f"finish_reason={finish}"
        return res

    def complete(self, messages, params: GenParams) -> ChatResult:
        t0 = time.perf_counter()
        res = self._complete(messages, params)
        res.latency_s = time.perf_counter() - t0
        return res

    def _redact(self, t: str) -> str:
        """Error text with every configured key replaced (a server may echo the key back)."""
        for k in self.keys._keys:
            if k:
                t = t.replace(k, "***")
        return t

    def _post(self, body: dict[str, Any], headers: dict[str, str], limit_s: float) -> tuple[int, dict[str, str], bytes]:
        """One request that ends within `limit_s` whatever the server does (httpx's own timeout is per
        read: a body dripping in slowly, or headers sent byte by byte, would outlive it many times).
        The request runs on a helper thread; at the limit this call raises and the helper's response
        is closed (the helper then ends at its next read)."""
        box: dict[str, Any] = {}
        done = threading.Event()

        def work() -> None:
            try:
                with self._client.stream("POST", f"{self.base_url}/chat/completions", json=body,
                                         headers=headers) as r:
                    box["response"] = r
                    chunks = []
                    for chunk in r.iter_bytes():
                        if box.get("abandoned"):
                            return
                        chunks.append(chunk)
                    box["out"] = (r.status_code, dict(r.headers), b"".join(chunks))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                box["error"] = e
            finally:
                done.set()
        threading.Thread(target=work, daemon=True, name="chat-request").start()
        if not done.wait(max(0.0, limit_s)):
            box["abandoned"] = True
            response = box.get("response")
            if response is not None:
                with contextlib.suppress(Exception):
                    response.close()
            raise _Deadline()
        if "error" in box:
            raise box["error"]
        return box["out"]

    def _complete(self, messages, params: GenParams) -> ChatResult:
        import httpx
        body = self._body(messages, params)
        last_error = "no attempt"
        attempt = 0
        call_deadline = time.monotonic() + self.total_timeout_s
        while attempt <= self.max_retries:
            left = call_deadline - time.monotonic()
            if left <= 0:
                last_error += f"; the call's total_timeout_s={self.total_timeout_s:g}s is spent"
                break
            attempt += 1
            key = self.keys.next()
            if key is None and self.keys._keys:
                return ChatResult("", "failed", error="every API key was rejected (HTTP 401)", model=self.model,
                                  attempts=attempt)
            headers = {"Content-Type": "application/json"}
            if key:
                headers["Authorization"] = f"Bearer {key}"
            wait = None
            try:
                code, rheaders, content = self._post(body, headers, min(self.timeout_s, left))
            except (httpx.TimeoutException, _Deadline):
                last_error = f"no complete answer within {min(self.timeout_s, left):.3g}s"
            except httpx.TransportError as e:
                last_error = f"transport error: {type(e).__name__}"
            else:
                text_body = self._redact(content.decode("utf-8", errors="replace"))
                if code == 401 and key or code == 403 and key and "invalid_api_key" in text_body:
                    # only a rejected key retires it; a 403 is a permission on this request, not the key
                    self.keys.retire(key)
                    last_error = f"HTTP {code}: key rejected"
                    attempt -= 1 if self.keys.alive else 0   # a rejected key is not a retry of the request
                    continue
                if code in RETRY_STATUS:
                    last_error = f"HTTP {code}"
                    wait = _retry_after(rheaders.get("retry-after"))
                    if wait is not None and wait > self.max_backoff_s:
                        last_error += f" (Retry-After {wait:.0f}s capped at max_backoff_s={self.max_backoff_s:.0f}s)"
                        wait = self.max_backoff_s
                elif 300 <= code < 400:
                    return ChatResult("", "failed", error=f"HTTP {code}: redirected to {rheaders.get('location')!r}; "
                                      f"point base_url at the final address", model=self.model, attempts=attempt)
                elif code >= 400:
                    if any(m in text_body for m in SAFETY_MARKERS):
                        return ChatResult("", "blocked", error=f"HTTP {code}: {text_body[:300]}", model=self.model,
                                          attempts=attempt)
                    return ChatResult("", "failed", error=f"HTTP {code}: {text_body[:300]}", model=self.model,
                                      attempts=attempt)
                else:
                    try:
                        return self._parse(json.loads(content), attempt)
                    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
                        last_error = f"malformed response body ({type(e).__name__})"
            if attempt > self.max_retries:
                break
            if wait is None:
                wait = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)
            self._sleep(max(0.0, min(wait, call_deadline - time.monotonic())))
        return ChatResult("", "failed", error=f"gave up after {attempt} attempts: {last_error}", model=self.model,
                          attempts=attempt)


class _Deadline(Exception):
    """A request outlived its whole-request deadline."""


# ----------------------------------------------------------------------------- Hugging Face backend
class HFChatBackend:
    """A Hugging Face chat model driven through its chat template.

    `task="image-text-to-text"` (default): AutoModelForImageTextToText + AutoProcessor
    (InternVL3.5, Pixtral, PaliGemma, memeworld-vlm). `task="causal-lm"`: a text-only
    AutoModelForCausalLM + AutoTokenizer, optionally from a GGUF file (`gguf_file`,
    dequantized by transformers); image parts are an error (wrap it in `CaptionedBackend`).
    """

    def __init__(self, model_id: str, revision: str | None = None, dtype: str = "float32", device: str | None = None,
                 model=None, processor=None, identity: dict[str, Any] | None = None,
                 task: str = "image-text-to-text", gguf_file: str | None = None):
        import torch
        if task not in ("image-text-to-text", "causal-lm"):
            raise PresetError(f"hf chat task must be 'image-text-to-text' or 'causal-lm', got {task!r}")
        self.model_id, self.revision, self.task = model_id, revision, task
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if model is None:
            kw: dict[str, Any] = {"revision": revision} if revision and not Path(model_id).exists() else {}
            if gguf_file:
                kw["gguf_file"] = gguf_file
            if task == "causal-lm":
                from transformers import AutoModelForCausalLM, AutoTokenizer
                processor = AutoTokenizer.from_pretrained(model_id, **kw)
                model = AutoModelForCausalLM.from_pretrained(model_id, dtype=torch_dtype(dtype), **kw)
            else:
                from transformers import AutoModelForImageTextToText, AutoProcessor
                processor = AutoProcessor.from_pretrained(model_id, **kw)
                model = AutoModelForImageTextToText.from_pretrained(model_id, dtype=torch_dtype(dtype), **kw)
        self.model = model.to(self.device).eval()
        self.processor = processor
        self._identity = identity or {"model": model_id, "revision": revision}
        self._lock = threading.Lock()   # one generate at a time on one model

    def identity(self) -> dict[str, Any]:
        return self._identity

    def _hf_messages(self, messages) -> list[dict[str, Any]]:
        from PIL import Image
        out = []
        for m in messages:
            if self.task == "causal-lm":
                if any(p["type"] == "image" for p in _parts(m)):
                    raise ValueError(f"{self.model_id} is a text-only model and got an image part: wrap it in the "
                                     f"captioned adapter (backend: captioned) to replace images by captions")
                out.append({"role": m["role"], "content": "".join(p["text"] for p in _parts(m))})
                continue
            parts = []
            for p in _parts(m):
                if p["type"] == "image":
                    img = p["image"]
                    if not hasattr(img, "convert"):
                        img = Image.open(io.BytesIO(image_bytes(img)))
                    parts.append({"type": "image", "image": img.convert("RGB")})
                else:
                    parts.append({"type": "text", "text": p["text"]})
            out.append({"role": m["role"], "content": parts})
        return out

    @property
    def has_chat_template(self) -> bool:
        tok = getattr(self.processor, "tokenizer", self.processor)
        return bool(getattr(self.processor, "chat_template", None) or getattr(tok, "chat_template", None))

    def _prefix_prompt(self, messages) -> tuple[str, list[Any]]:
        """A model without a chat template (PaliGemma-pt): one user turn, its text as the prefix and
        its images to the processor, which inserts the image tokens itself."""
        if len(messages) != 1 or messages[0]["role"] != "user":
            raise ValueError(f"{self.model_id} has no chat template: it takes a single user turn (image + prefix "
                             f"text), got roles {[m['role'] for m in messages]}")
        parts = messages[0]["content"]
        return ("".join(p["text"] for p in parts if p["type"] == "text"),
                [p["image"] for p in parts if p["type"] == "image"])

    def complete_batch(self, conversations: Sequence[Sequence[dict[str, Any]]], params: GenParams) -> list[ChatResult]:
        """Several conversations in one left-padded generate call (greedy or seeded sampling)."""
        import torch
        tok = getattr(self.processor, "tokenizer", self.processor)
        side = tok.padding_side
        tok.padding_side = "left"
        try:
            msgs = [self._hf_messages(m) for m in conversations]
            if self.task == "causal-lm":
                inputs = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=True,
                                                 return_tensors="pt", padding=True)
            elif self.has_chat_template:
                inputs = self.processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                                            return_dict=True, return_tensors="pt",
                                                            processor_kwargs={"padding": True})
            else:
                texts, ims = zip(*(self._prefix_prompt(m) for m in msgs))
                inputs = self.processor(text=list(texts), images=[i[0] if len(i) == 1 else list(i) for i in ims],
                                        padding=True, return_tensors="pt")
        finally:
            tok.padding_side = side
        dtype = next(self.model.parameters()).dtype
        inputs = {k: (v.to(self.device, dtype) if v.is_floating_point() else v.to(self.device))
                  for k, v in inputs.items() if hasattr(v, "to")}
        gen = {"max_new_tokens": params.max_new_tokens, "do_sample": params.temperature > 0}
        if params.temperature > 0:
            gen.update(temperature=params.temperature, top_p=params.top_p)
        if tok.pad_token_id is not None:
            gen["pad_token_id"] = tok.pad_token_id
        with self._lock, torch.no_grad():
            torch.manual_seed(params.seed)
            out = self.model.generate(**inputs, **gen)
        n_in = inputs["input_ids"].shape[1]
        eos = self.model.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [eos])
        results = []
        for i in range(len(conversations)):
            new = out[i, n_in:].tolist()
            # the answer ends at its first end-of-sequence token (pad may equal eos: cut, don't filter)
            n_new = next((j + 1 for j, t in enumerate(new) if t in eos), None)
            finish = "stop" if n_new is not None else "length"
            keep = new[:n_new] if n_new is not None else [t for t in new if t != tok.pad_token_id]
            prompt_len = int(inputs["attention_mask"][i].sum()) if "attention_mask" in inputs else n_in
            results.append(ChatResult(tok.decode(keep, skip_special_tokens=True).strip(),
                                      usage={"prompt_tokens": prompt_len, "completion_tokens": len(keep)},
                                      finish_reason=finish, model=self.model_id))
        return results

    def complete(self, messages, params: GenParams) -> ChatResult:
        return self.complete_batch([messages], params)[0]


# ----------------------------------------------------------------------------- images for text-only models
class CaptionedBackend:
    """Lets a text-only chat model take the protocol's image parts: each image is replaced by a
    caption written by a captioner (any chat model that sees pixels), then the conversation goes
    to the text-only model. Captions go through the captioner's own response cache (keyed by the
    image bytes and the caption prompt), so each image is captioned once.

    The adapter's identity (adapter, captioner identity, caption prompt and decoding, the
    template that inlines the caption) is part of every cache key: the same question with
    another captioner is another request. A model behind this adapter never saw pixels, and
    every notebook that uses one says so.
    """

    def __init__(self, inner: ChatBackend, captioner: Chat, caption_prompt: str = "Describe the image.",
                 caption_params: GenParams = GenParams(temperature=0.0, max_new_tokens=60),
                 image_template: str | None = None):
        self.inner = inner
        self.captioner = captioner
        self.caption_prompt = caption_prompt
        self.caption_params = caption_params
        self.image_template = image_template or prompt_template("captioned/image.txt").strip("\n")
        self.native_schema = bool(getattr(inner, "native_schema", False))
        self._captions: dict[str, ChatResult] = {}
        self._lock = threading.Lock()

    def identity(self) -> dict[str, Any]:
        return {**self.inner.identity(), "adapter": "captioned", "captioner": self.captioner.backend.identity(),
                "caption_prompt": self.caption_prompt, "caption_params": asdict(self.caption_params),
                "image_template": self.image_template}

    def caption_images(self, images: Sequence[Any]) -> list[ChatResult]:
        """Captions for images (cached per image by content), batched through the captioner."""
        digests = [hashlib.sha256(image_bytes(im)).hexdigest() for im in images]
        with self._lock:
            todo = {d: im for d, im in zip(digests, images) if d not in self._captions}
        if todo:
            res = self.captioner.generate_many([[user(im, self.caption_prompt)] for im in todo.values()],
                                               self.caption_params, progress=False)
            with self._lock:
                self._captions.update(zip(todo, res))
        return [self._captions[d] for d in digests]

    def describe(self, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """The conversation with every image part replaced by its caption (a text part)."""
        images = [p["image"] for m in messages for p in _parts(m) if p.get("type") == "image"]
        caps = iter(self.caption_images(images)) if images else iter(())
        out = []
        for m in messages:
            parts = []
            for p in _parts(m):
                if p.get("type") == "image":
                    c = next(caps)
                    if c.status != "ok":
                        raise CaptionError(f"captioner {self.captioner.name or 'model'} could not caption an image "
                                           f"({c.status}: {c.error})")
                    parts.append(text(self.image_template.format(caption=c.text)))
                else:
                    parts.append(p)
            out.append({"role": m["role"], "content": parts})
        return out

    def prepare(self, conversations: Sequence[Sequence[dict[str, Any]]]) -> None:
        """Caption every image of these conversations in one batched pass (optional warm-up)."""
        self.caption_images([p["image"] for c in conversations for m in c for p in _parts(m)
                             if p.get("type") == "image"])

    def complete(self, messages, params: GenParams) -> ChatResult:
        try:
            described = self.describe(messages)
        except CaptionError as e:
            return ChatResult("", "failed", error=str(e), model=str(self.inner.identity().get("model", "")))
        return self.inner.complete(described, params)


class CaptionError(RuntimeError):
    """The captioner behind a CaptionedBackend could not caption an image."""


# ----------------------------------------------------------------------------- loading
def default_cache_path(profile: str) -> Path:
    return ROOT / "artifacts" / profile / "cache" / "responses.sqlite"


def served_identity(preset: Preset) -> dict[str, Any]:
    """Cache identity of a model this compendium serves itself (a `serve:` section): the GGUF's
    digest and the engine's version, not the (ephemeral) port."""
    from importlib import metadata

    from lib.presets import resolve_model_path, weights_digest
    gguf = Path(resolve_model_path(preset.options["serve"]["gguf"]))
    try:
        engine = f"llama.cpp (xllamacpp {metadata.version('xllamacpp')})"
    except metadata.PackageNotFoundError:
        engine = "llama.cpp"
    return {"gguf": weights_digest(gguf) if gguf.exists() else str(gguf), "engine": engine}


def load_backend(preset: Preset, device: str | None = None, env_file: str | Path | None = None,
                 base_url: str | None = None, cache: ResponseCache | str | Path | None = None) -> ChatBackend:
    """The backend a preset names. `base_url` overrides an HTTP preset's endpoint (a server started
    on a free port); `cache` is the response cache a captioned adapter's captioner uses."""
    o = preset.options
    if preset.backend == "hf":
        local = preset.resolved_model
        if "{artifacts}" in preset.model and not Path(local).exists():
            from lib.artifacts import MissingInputError
            raise MissingInputError(f"chat preset '{preset.name}': {local} does not exist; "
                                    f"train it with `make reproduce NB=models`")
        return HFChatBackend(local, preset.revision, preset.dtype, device, identity=preset.identity(),
                             task=o.get("task", "image-text-to-text"), gguf_file=o.get("gguf_file"))
    if preset.backend == "openai_compatible":
        keys = api_keys(o["api_key_env"], env_file) if o.get("api_key_env") else []
        served = "serve" in o
        return OpenAICompatibleBackend(preset.model, base_url or o["base_url"], keys, revision=preset.revision,
                                       timeout_s=float(o.get("timeout_s", 60)),
                                       total_timeout_s=float(o["total_timeout_s"]) if o.get("total_timeout_s")
                                       else None,
                                       max_retries=int(o.get("max_retries", 5)),
                                       price_in=float(o.get("price_in", 0.0)), price_out=float(o.get("price_out", 0.0)),
                                       api_key_optional=bool(o.get("api_key_optional", served)),
                                       structured_output=str(o.get("structured_output", "json_schema")),
                                       identity_extra=served_identity(preset) if served else None)
    if preset.backend == "captioned":
        inner = load_backend(get_preset("chat", preset.model), device, env_file, base_url, cache)
        captioner = load_chat(o["captioner"], cache=cache, device=device, env_file=env_file)
        return CaptionedBackend(inner, captioner, caption_prompt=str(o.get("caption_prompt", "Describe the image.")),
                                caption_params=GenParams(temperature=0.0,
                                                         max_new_tokens=int(o.get("caption_max_new_tokens", 60))))
    raise PresetError(f"chat preset '{preset.name}': unknown backend '{preset.backend}' "
                      f"(hf, openai_compatible, captioned)")


def load_chat(name_or_path: str | Path, cache: ResponseCache | str | Path | None = None, device: str | None = None,
              env_file: str | Path | None = None, base_url: str | None = None) -> Chat:
    """A cached chat model from a preset name (params/presets/chat.yaml) or a local HF folder.

    `base_url` points an HTTP preset (or the text model behind a captioned one) at a running
    server, e.g. `lib.serve.serve(...).base_url`."""
    p = Path(str(name_or_path))
    if p.is_dir() and (p / "config.json").exists():
        preset = Preset(name=p.name, backend="hf", model=str(p))
    else:
        preset = get_preset("chat", str(name_or_path))
    if isinstance(cache, (str, Path)):
        cache = ResponseCache(cache)
    backend = load_backend(preset, device, env_file, base_url, cache)
    base = get_preset("chat", preset.model) if preset.backend == "captioned" else preset
    local = base.backend == "hf"
    opts = {**base.options, **preset.options}
    return Chat(backend, cache, max_workers=int(opts.get("max_workers", 1 if local else 8)), name=preset.name,
                batch_size=int(opts.get("batch_size", 16 if local else 1)),
                schema_retries=int(opts.get("schema_retries", 2)))
