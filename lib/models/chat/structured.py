"""Structured answers: reading JSON out of free text (total and linear), checking it against a
schema or choice list, and asking for it in the prompt when a backend cannot constrain decoding."""
from __future__ import annotations

import json
import re
from typing import Any, Sequence

from lib.compendium.artifacts import loads_strict
from lib.models.chat.messages import ChatResult, GenParams, parts_of, text, user
from lib.compendium.prompts import prompt_template

#: Answers longer than this are not read as JSON (no answer of a max_new_tokens-bounded call comes near).
MAX_JSON_CHARS = 200_000
#: Deeper nesting than this is refused before any decoding (no schema here nests past 5 levels).
MAX_JSON_DEPTH = 64
_JSON_SPECIAL = re.compile(r'[{}\[\]"\\]')


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


class _DuplicateKey(ValueError):
    """A key repeated in an answer's JSON object: never read past (the answer is ambiguous)."""


def _loads(text: str) -> Any:
    return loads_strict(text, duplicate_error=_DuplicateKey)


def ambiguity(text: str) -> str | None:
    """Why an answer's JSON has more than one reading, or None: a key repeated in an object (which of its
    values is the answer?) or two different JSON objects side by side (two verdicts). The one rule every
    reader of a model's answer applies (the structured check, ARCADE's verdicts in both parse modes,
    SEI's free-text reader): such an answer is unparseable, never read as its first or last value.
    Total and linear like extract_json; an answer too long or deep to read is not ambiguous here (the
    readers refuse it on their own)."""
    t = (text if isinstance(text, str) else "").strip()
    if not t or "{" not in t or len(t) > MAX_JSON_CHARS:
        return None
    try:
        spans = _object_spans(t)
    except ValueError:
        return None
    outer, end = [], -1
    for a, b in spans:                         # the outermost objects, in order
        if a >= end:
            outer.append((a, b))
            end = b
    values = []
    for a, b in ([(0, len(t))] if t.startswith("{") and (0, len(t)) in spans else []) + outer:
        try:
            v = _loads(t[a:b])
        except _DuplicateKey as e:
            return str(e)
        except ValueError:
            continue
        if v not in values:
            values.append(v)
    return "two different JSON objects in one answer (two readings)" if len(values) > 1 else None


def extract_json(text: str) -> Any:
    """The JSON value in an answer: the whole text, else its first balanced {...} block that
    decodes (models often wrap JSON in prose or code fences). Total and linear in the answer's
    length: a ValueError (never another exception) when there is none, when a key repeats, when a
    number is not finite, when nesting passes MAX_JSON_DEPTH or the answer MAX_JSON_CHARS."""
    t = (text if isinstance(text, str) else "").strip()
    if len(t) > MAX_JSON_CHARS:
        raise ValueError(f"the answer is {len(t):,} characters long; at most {MAX_JSON_CHARS:,} are read as JSON")
    spans = _object_spans(t)                   # also the depth check, before any decoding
    why = ambiguity(t)
    if why:
        raise ValueError(why)
    try:
        return _loads(t)
    except _DuplicateKey:
        raise
    except ValueError:
        pass
    # nested spans are each at most MAX_JSON_DEPTH deep, so all of them together are O(depth x length)
    for start, end in spans:
        try:
            return _loads(t[start:end])
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
    import jsonschema  # lazy: a GPU machine's image without it can still train and serve agents
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
    out[last] = {**out[last], "content": parts_of(out[last]) + [text("\n\n" + instr)]}
    return out


_SURROGATE = re.compile(r"[\ud800-\udfff]")


def clean_text(value: Any) -> str:
    """A model's text as every later step can store and encode: a lone UTF-16 surrogate (which a
    server can send as a JSON escape) becomes U+FFFD; a missing text becomes ''."""
    if not isinstance(value, str):
        return "" if value is None else str(value)
    return _SURROGATE.sub("\ufffd", value)


def storable(r: ChatResult) -> ChatResult:
    r.text = clean_text(r.text)
    if r.error is not None:
        r.error = clean_text(r.error)
    return r


def cap_string_lengths(schema: Any, cap: int) -> Any:
    """A copy of a JSON schema whose every string field allows at most `cap` characters
    (an existing smaller maxLength, an enum or a pattern is kept as it is)."""
    if isinstance(schema, list):
        return [cap_string_lengths(x, cap) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: cap_string_lengths(v, cap) for k, v in schema.items()}
    if out.get("type") == "string" and "enum" not in out and "const" not in out:
        out["maxLength"] = min(int(out.get("maxLength", cap)), cap)
        out["minLength"] = min(int(out.get("minLength", 0)), out["maxLength"])
        if out["minLength"] == 0:
            out.pop("minLength")
    return out
