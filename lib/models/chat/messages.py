"""Messages, decoding parameters and results: the vocabulary every chat backend speaks."""
from __future__ import annotations

import hashlib
import io
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence


STATUSES = ("ok", "unparseable", "refused", "blocked", "failed")


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
    replicate: int = 0           # a cold run's index: the same request asked afresh, its answer cached apart
                                 # (part of the cache key when > 0; never sent to the model)

    def __post_init__(self):
        if self.choices is not None:
            object.__setattr__(self, "choices", tuple(str(c) for c in self.choices))
            if not self.choices:
                raise ValueError("GenParams.choices must hold at least one choice")
        if self.json_schema is not None and self.choices is not None:
            raise ValueError("GenParams takes a json_schema or choices, not both")
        if isinstance(self.replicate, bool) or not isinstance(self.replicate, int) or self.replicate < 0:
            raise ValueError(f"GenParams.replicate must be an integer >= 0, got {self.replicate!r}")
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


def parts_of(msg: dict[str, Any]) -> list[dict[str, Any]]:
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
        for p in parts_of(m):
            if p.get("type") == "image":
                parts.append({"type": "image", "sha256": hashlib.sha256(image_bytes(p["image"])).hexdigest()})
            elif p.get("type") == "text":
                parts.append({"type": "text", "text": p["text"]})
            else:
                raise ValueError(f"message {i}: unknown part type {p.get('type')!r} (text or image)")
        out.append({"role": m["role"], "content": parts})
    return out


def cache_key(identity: dict[str, Any], messages: Sequence[dict[str, Any]], params: GenParams) -> str:
    """The request's hash: model identity, messages (images by content) and decoding parameters. A
    cold run's `replicate` joins the key only when > 0, so the first run's keys are those of a
    request that never heard of replicates."""
    p = asdict(params)
    if not p["replicate"]:
        del p["replicate"]
    blob = json.dumps({"model": identity, "messages": canonical(messages), "params": p},
                      sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()
