"""A loopback OpenAI-compatible server that answers like a constrained-decoding server, without a model.

    python -m lib.models.chat.loopback --port 18791          # until Ctrl-C

The paper profile's API and vLLM presets (GPT-4o, Gemini, Qwen-VL-Max, vLLM InternVL3.5 and
Pixtral) reach their models through `openai_compatible`. The `paper-smoke` profile points them
here, so that every request the paper profile sends (images as base64 `image_url` parts,
`response_format: {"type": "json_schema", "json_schema": {..., "strict": true}}` as vLLM and OpenAI
take it, temperature, max_tokens, seed) is checked and answered:

- a request with a JSON Schema gets a JSON object valid against it (enums chosen by a hash of the
  request, so answers differ between memes and repeat for the same request), as a server that
  constrains decoding returns; the schema itself must be valid and every image must decode;
- a request without one gets plain text "<label> - <words>" with the label chosen the same way.

A malformed request is answered 400 with the reason, as vLLM answers one. This is a test
device for plumbing: its answers carry no information about the memes.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jsonschema
from PIL import Image

LABELS = ("hateful", "non-hateful")
#: the environment variable holding the running loopback server's URL; a preset whose base_url is
#: "{loopback}" is sent there (lib.compendium.stages starts the server on a free port and sets it)
LOOPBACK_ENV = "COMPENDIUM_LOOPBACK_URL"
#: what a loopback answer's cache identity names instead of its (per-run) port. "server" is a name in the
#: cache keys, not an import path (it was this module's path when make test's committed answers were
#: recorded): a new value would make paper-smoke ask every committed answer again
IDENTITY = {"server": "lib.chat.loopback", "answers": "schema-valid by request hash", "version": 1}


def loopback_url(spec: str) -> str:
    """`spec` with "{loopback}" replaced by the running loopback server's URL (LOOPBACK_ENV)."""
    if "{loopback}" not in spec:
        return spec
    url = os.environ.get(LOOPBACK_ENV)
    if not url:
        raise RuntimeError(f"base_url {spec!r} needs the loopback server: run the stage through lib.compendium.stages (make reproduce), "
                           f"or start `python -m lib.models.chat.loopback` and set {LOOPBACK_ENV} to its /v1 URL")
    return spec.replace("{loopback}", url.rstrip("/"))


class BadRequest(ValueError):
    pass


def _pick(options, key: str, salt: str):
    h = int(hashlib.sha256(f"{key}|{salt}".encode()).hexdigest(), 16)
    return options[h % len(options)]


def example(schema: dict[str, Any], key: str, path: str = "$", defs: dict[str, Any] | None = None) -> Any:
    """A value valid against `schema` (the subset constrained decoders support), chosen by `key`."""
    defs = defs if defs is not None else {**schema.get("$defs", {}), **schema.get("definitions", {})}
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        if name not in defs:
            raise BadRequest(f"{path}: unresolved $ref {schema['$ref']!r}")
        return example(defs[name], key, path, defs)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return _pick(list(schema["enum"]), key, path)
    for k in ("anyOf", "oneOf"):
        if k in schema:
            return example(_pick(list(schema[k]), key, path), key, path, defs)
    if "allOf" in schema:
        merged: dict[str, Any] = {}
        for s in schema["allOf"]:
            merged.update(s)
        return example(merged, key, path, defs)
    t = schema.get("type", "object")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), "null")
    if t == "object":
        props = schema.get("properties", {})
        return {p: example(s, key, f"{path}.{p}", defs) for p, s in props.items()}
    if t == "array":
        n = max(int(schema.get("minItems", 0)), min(1, int(schema.get("maxItems", 1))))
        return [example(schema.get("items", {"type": "string"}), key, f"{path}[{i}]", defs) for i in range(n)]
    if t == "string":
        words = f"smoke answer {_pick(['one', 'two', 'three'], key, path)}"
        lo, hi = int(schema.get("minLength", 0)), schema.get("maxLength")
        words = words.ljust(lo, ".")
        return words[:int(hi)] if hi is not None else words
    if t in ("integer", "number"):
        lo = schema.get("minimum", schema.get("exclusiveMinimum", 0))
        return int(lo) + (1 if "exclusiveMinimum" in schema else 0) if t == "integer" else float(lo)
    if t == "boolean":
        return _pick([True, False], key, path)
    if t == "null":
        return None
    raise BadRequest(f"{path}: unsupported type {t!r}")


def answer(body: dict[str, Any]) -> tuple[str, dict[str, int]]:
    """The answer text and token usage for one chat-completions request (BadRequest when malformed)."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("messages must be a non-empty list")
    n_images, chars = 0, 0
    for i, m in enumerate(msgs):
        if m.get("role") not in ("system", "user", "assistant"):
            raise BadRequest(f"messages[{i}].role {m.get('role')!r}")
        content = m.get("content")
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(parts, list):
            raise BadRequest(f"messages[{i}].content must be a string or a list of parts")
        for j, p in enumerate(parts):
            if p.get("type") == "text":
                chars += len(p.get("text") or "")
            elif p.get("type") == "image_url":
                url = (p.get("image_url") or {}).get("url", "")
                head, _, data = url.partition(",")
                if not head.startswith("data:image/") or ";base64" not in head:
                    raise BadRequest(f"messages[{i}].content[{j}]: image_url must be a base64 data URI")
                try:
                    Image.open(io.BytesIO(base64.b64decode(data, validate=True))).verify()
                except Exception as e:                       # any decoding failure is the client's error
                    raise BadRequest(f"messages[{i}].content[{j}]: the image does not decode ({e})") from None
                n_images += 1
            else:
                raise BadRequest(f"messages[{i}].content[{j}]: unknown part type {p.get('type')!r}")
    key = hashlib.sha256(json.dumps(msgs, sort_keys=True).encode()).hexdigest()
    fmt = body.get("response_format") or {}
    if fmt.get("type") == "json_schema":
        spec = fmt.get("json_schema") or {}
        schema = spec.get("schema")
        if not isinstance(schema, dict) or not spec.get("name"):
            raise BadRequest("response_format.json_schema needs a name and a schema object")
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as e:
            raise BadRequest(f"response_format.json_schema.schema is not a valid JSON Schema: {e.message}") from None
        value = example(schema, key)
        jsonschema.validate(value, schema)
        text = json.dumps(value)
    elif fmt.get("type") == "json_object":
        text = json.dumps({"label": _pick(LABELS, key, "label"), "answer": "smoke answer"})
    else:
        text = f"{_pick(LABELS, key, 'label')} - smoke answer from the loopback server"
    max_tokens = body.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise BadRequest(f"max_tokens must be a positive integer, not {max_tokens!r}")
    usage = {"prompt_tokens": chars // 4 + 256 * n_images, "completion_tokens": max(1, len(text) // 4)}
    return text, usage


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _send(self, code: int, obj: dict[str, Any]) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path.rstrip("/") in ("/health", "/v1/health"):
            return self._send(200, {"status": "ok"})
        if self.path.rstrip("/") == "/v1/models":
            return self._send(200, {"object": "list", "data": [{"id": "loopback", "object": "model"}]})
        return self._send(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self):
        if self.path.rstrip("/") != "/v1/chat/completions":
            return self._send(404, {"error": {"message": f"no route {self.path}"}})
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            text, usage = answer(body)
        except (BadRequest, json.JSONDecodeError) as e:
            return self._send(400, {"error": {"message": str(e), "type": "BadRequestError"}})
        with self.server.lock:                               # type: ignore[attr-defined]
            self.server.requests += 1                        # type: ignore[attr-defined]
        self._send(200, {"id": "loopback", "object": "chat.completion", "model": body.get("model", ""),
                         "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": text}}],
                         "usage": {**usage, "total_tokens": sum(usage.values())}})


def start(port: int = 0, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """A running server on a daemon thread (port 0: a free one); `.shutdown()` stops it."""
    srv = ThreadingHTTPServer((host, port), _Handler)
    srv.lock, srv.requests = threading.Lock(), 0             # type: ignore[attr-defined]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=18791)
    ap.add_argument("--host", default="127.0.0.1")
    args = ap.parse_args(argv)
    srv = ThreadingHTTPServer((args.host, args.port), _Handler)
    srv.lock, srv.requests = threading.Lock(), 0             # type: ignore[attr-defined]
    print(f"loopback server on http://{args.host}:{args.port}/v1", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
