"""What in a result file says how a run went rather than what it found: times, rates, call counts, cache and code
bookkeeping. Comparisons set it aside (lib.compendium.compare, the committed-results checks), and publishing keeps
the committed bytes of a file whose new version differs only there, so a rerun that moves no result leaves every
tracked file as it was."""
from __future__ import annotations

import csv
import gzip
import io
import json
import math
import re
from pathlib import Path
from typing import Any, Callable

#: metrics that measure the machine, not the method (timings, rates per second, call and token counts): never
#: compared. Anchored: a per-second rate is `_per_s` at a word's end (`tokens_per_s`, `pairs_per_s_floor`), so
#: ARCADE's `calls_per_sample` and `tokens_per_sample` (what the protocol costs, a finding) are results, and so are
#: the generation settings `max_new_tokens`, `agent_max_new_tokens` and `schema_max_new_tokens`
TIMING = re.compile(r"(_s$|_s_|_per_s(?:$|_)|^ttft|speedup|scaling|latency|wall|^calls$|_calls$|"
                    r"(?<!max_new)_tokens$|floor_ratio|render_s|cache_hits)")


#: a column named as a rate per second ("pairs/s (batched)"), not a per-sample one ("calls/sample")
PER_SECOND = re.compile(r"/s(?![a-z])")


def per_second(key: str) -> bool:
    return bool(PER_SECOND.search(key))


#: fields that say how a run went (its times, its cache bookkeeping), not what it found
BOOKKEEPING = frozenset({"from_cache", "cache_hits", "calls_made", "cache_key", "generator_sha256",
                         "created", "finished", "seconds", "render_seconds"})
#: a response-cache key (a field named "key" holding one is bookkeeping; a model's answer field named "key" is not)
CACHE_KEY = re.compile(r"[0-9a-f]{64}")


def bookkeeping(key: str, value: Any) -> bool:
    """Whether a result field records how a run went (a time, a rate, a call count, a code digest) rather than what
    it found."""
    return (key in BOOKKEEPING or bool(TIMING.search(key)) or per_second(key)
            or (key == "calls" and isinstance(value, int) and not isinstance(value, bool))
            or (key == "key" and isinstance(value, str) and bool(CACHE_KEY.fullmatch(value))))


def timing(key: str, value: Any = None) -> bool:
    """Whether a result field is a time or a rate (narrower than `bookkeeping`: a cache key or code digest is not)."""
    return bool(TIMING.search(key)) or per_second(key)


def without_bookkeeping(value: Any, drop: Callable[[str, Any], bool] = bookkeeping) -> Any:
    """A decoded result without the fields `drop` names (its bookkeeping), at any depth (NaN made comparable)."""
    if isinstance(value, dict):
        return {k: without_bookkeeping(v, drop) for k, v in value.items() if not drop(str(k), v)}
    if isinstance(value, list):
        return [without_bookkeeping(v, drop) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return value


def _decoded(name: str, data: bytes, drop: Callable[[str, Any], bool] = bookkeeping) -> Any:
    """A result file's content for comparison: JSON, JSON lines, or CSV rows without the fields `drop` names."""
    if name.endswith(".gz"):
        data, name = gzip.decompress(data), name[:-3]
    text = data.decode("utf-8")
    if name.endswith(".json"):
        return without_bookkeeping(json.loads(text), drop)
    if name.endswith(".jsonl"):
        return [without_bookkeeping(json.loads(x), drop) for x in text.splitlines() if x.strip()]
    if name.endswith(".csv"):
        rows = list(csv.reader(io.StringIO(text, newline="")))
        keep = [i for i, c in enumerate(rows[0]) if not drop(c, None)] if rows else []
        return [[r[i] if i < len(r) else None for i in keep] for r in rows]
    return text


def same_result(committed: Path, new: bytes) -> bool:
    """Whether a published file's new bytes say what the committed file says, times and bookkeeping aside: then the
    committed bytes stay, so a rerun that moves no result leaves every tracked file as it was."""
    try:
        return _decoded(committed.name, committed.read_bytes()) == _decoded(committed.name, new)
    except (OSError, ValueError, UnicodeDecodeError, EOFError, csv.Error):
        return False


def differs_in_times_only(name: str, committed: bytes, new: bytes) -> bool:
    """Whether two versions of a JSON, JSON-lines or CSV result file are equal once their times and rates are set
    aside (`timing`): what the runner requires before it writes committed bytes back over a run's copy."""
    if not name.endswith((".json", ".jsonl", ".csv")):
        return False
    try:
        return _decoded(name, committed, timing) == _decoded(name, new, timing)
    except (ValueError, UnicodeDecodeError, csv.Error):
        return False
