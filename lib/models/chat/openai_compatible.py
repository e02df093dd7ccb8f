"""Backend `openai_compatible`: any /v1/chat/completions endpoint (OpenAI, Gemini and Qwen
compatible endpoints, vLLM, llama.cpp's server) with timeouts, retries, key rotation and costs."""
from __future__ import annotations

import base64
import contextlib
import io
import json
import random
import threading
import time
from email.utils import parsedate_to_datetime
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import httpx
from PIL import Image

from lib.models.chat.keys import KeyRing, api_keys
from lib.models.chat.loopback import IDENTITY as LOOPBACK_IDENTITY, loopback_url
from lib.models.chat.messages import ChatResult, GenParams, image_bytes, parts_of
from lib.models.chat.registry import register_backend, served_identity
from lib.compendium.presets import Preset, PresetError, options_from


@dataclass
class HTTPOptions:
    """A `backend: openai_compatible` preset's options."""
    base_url: str = ""
    api_key_env: str | None = None         # NAME: keys NAME, NAME_1, NAME_2... from the environment or .env
    timeout_s: float = 60.0                # one attempt
    total_timeout_s: float | None = None   # one call with its retries (None: three attempts' worth)
    max_retries: int = 5
    price_in: float = 0.0                  # USD per million prompt tokens
    price_out: float = 0.0                 # USD per million completion tokens
    api_key_optional: bool | None = None   # None: optional exactly for a model served here (`serve:`)
    structured_output: str = "json_schema"  # or "prompt" for servers without response_format, or
                                            #   "llguidance_compact" (llama.cpp: the schema as a compact-JSON grammar)


STRUCTURED_OUTPUT = ("json_schema", "prompt", "llguidance_compact")


def compact_json_grammar(schema: dict[str, Any]) -> str:
    """An llguidance grammar (llama.cpp's `grammar` field) for answers valid against `schema`,
    written as compact JSON: no whitespace between tokens (llguidance's `x-guidance` option)."""
    spec = {**schema, "x-guidance": {**schema.get("x-guidance", {}), "whitespace_flexible": False}}
    return "%llguidance {}\nstart: %json " + json.dumps(spec, ensure_ascii=False, separators=(",", ":"))


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
        try:
            return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
        except (TypeError, ValueError):
            return None


@register_backend("openai_compatible")
class OpenAICompatibleBackend:
    """POST /chat/completions on any OpenAI-compatible server (OpenAI, vLLM, llama.cpp's server...).

    `structured_output`: "json_schema" sends a structured request's schema as OpenAI's
    `response_format: {"type": "json_schema", ...}` (the server constrains decoding: OpenAI,
    vLLM, llama.cpp); "prompt" leaves the schema to the prompt and the parse-and-retry path of
    `Chat`, for servers that lack it. "llguidance_compact" (llama.cpp's server built with
    llguidance, as xllamacpp is) sends the same schema as a `grammar` that also forbids whitespace
    between JSON tokens: the constraint is the schema's, the answer is one line, and the tokens a
    small model spends indenting pretty-printed JSON (about a third of a short answer) are not
    generated. It is part of the cache identity. `identity_extra` joins the cache identity (a served
    model's weights digest and engine, so the cache does not depend on its ephemeral port).
    """

    def __init__(self, model: str, base_url: str, keys: Sequence[str] = (), revision: str | None = None,
                 timeout_s: float = 60.0, max_retries: int = 5, backoff_s: float = 1.0, max_backoff_s: float = 60.0,
                 price_in: float = 0.0, price_out: float = 0.0, api_key_optional: bool = False,
                 sleep: Callable[[float], None] = time.sleep, structured_output: str = "json_schema",
                 identity_extra: dict[str, Any] | None = None, max_connections: int = 64,
                 total_timeout_s: float | None = None):
        if structured_output not in STRUCTURED_OUTPUT:
            raise PresetError(f"structured_output must be one of {', '.join(map(repr, STRUCTURED_OUTPUT))}, "
                              f"got {structured_output!r}")
        self.structured_output = structured_output
        self.native_schema = structured_output != "prompt"
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

    default_max_workers = 8        # a server batches concurrent requests itself
    default_batch_size = 1

    @classmethod
    def from_preset(cls, preset: Preset, *, env_file: str | Path | None = None, base_url: str | None = None,
                    **_) -> "OpenAICompatibleBackend":
        o = options_from(HTTPOptions, preset.options, f"chat preset '{preset.name}'")
        served = "serve" in preset.options
        if not (base_url or o.base_url):
            raise PresetError(f"chat preset '{preset.name}': options.base_url is missing")
        keys = api_keys(o.api_key_env, env_file) if o.api_key_env else []
        local = "{loopback}" in o.base_url and not base_url    # paper-smoke's test server: its port changes per run
        base_url = base_url or loopback_url(o.base_url)
        return cls(preset.model, base_url, keys, revision=preset.revision, timeout_s=o.timeout_s,
                   total_timeout_s=o.total_timeout_s, max_retries=o.max_retries, price_in=o.price_in,
                   price_out=o.price_out,
                   api_key_optional=o.api_key_optional if o.api_key_optional is not None else served,
                   structured_output=o.structured_output,
                   identity_extra=served_identity(preset) if served else dict(LOOPBACK_IDENTITY) if local else None)

    def identity(self) -> dict[str, Any]:
        """Model, revision and endpoint: two servers that share a model name are different models.
        A model served here names its weights' digest instead (its port changes every run)."""
        # the compact grammar asks for other tokens than response_format does: another cache entry
        mode = {"structured_output": self.structured_output} if self.structured_output == "llguidance_compact" else {}
        if self.identity_extra:
            return {"model": self.model, "revision": self.revision, "endpoint": "openai_compatible",
                    **self.identity_extra, **mode}
        return {"model": self.model, "revision": self.revision, "endpoint": "openai_compatible",
                "base_url": self.base_url, **mode}

    @staticmethod
    def _wire_messages(messages) -> list[dict[str, Any]]:
        out = []
        for m in messages:
            parts = []
            for p in parts_of(m):
                if p["type"] == "text":
                    parts.append({"type": "text", "text": p["text"]})
                else:
                    b = image_bytes(p["image"])
                    mime = "image/jpeg" if b[:3] == b"\xff\xd8\xff" else "image/png"
                    if mime == "image/png" and not b.startswith(b"\x89PNG"):
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
        if params.structured and self.structured_output == "llguidance_compact":
            body["grammar"] = compact_json_grammar(params.schema())
        elif params.structured and self.native_schema:
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
