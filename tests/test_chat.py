"""Chat layer: the OpenAI-compatible backend against a loopback server with injected faults,
the one response cache (replay with zero calls, crash safety, concurrent writers, no secrets),
key rotation, and the Hugging Face backend on a tiny image-text-to-text model."""
import json
import sqlite3
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from PIL import Image

from lib.models.chat import (Chat, ChatResult, GenParams, OpenAICompatibleBackend, ResponseCache, api_keys, cache_key,
                      load_chat, read_dotenv, user)

GOOD_KEY = "test-key-good-000"
BAD_KEY = "test-key-revoked-111"


class FaultServer:
    """An OpenAI-compatible /v1/chat/completions on 127.0.0.1. The prompt text picks the fault:
    'f429' -> first attempt 429 with Retry-After: 1; 'f500' -> first attempt 500; 'hang' -> first
    attempt sleeps past the client's timeout; 'malformed' -> first attempt 200 with a broken body;
    'refuse' -> a refusal; 'block' -> finish_reason content_filter; 'always500' -> 500 forever.
    A completed 200 answer is 'billed' once per delivery."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests = 0
        self.attempts: dict[str, list[float]] = {}
        self.billed: dict[str, int] = {}
        srv = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, body: bytes, headers=None):
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with srv.lock:
                    srv.requests += 1
                if self.headers.get("Authorization") != f"Bearer {GOOD_KEY}":
                    return self._send(401, b'{"error": {"message": "invalid key"}}')
                msgs = body["messages"]
                content = msgs[-1]["content"]
                prompt = content if isinstance(content, str) else " ".join(
                    p.get("text", "") for p in content if p["type"] == "text")
                n_images = 0 if isinstance(content, str) else sum(p["type"] == "image_url" for p in content)
                with srv.lock:
                    srv.attempts.setdefault(prompt, []).append(time.time())
                    n = len(srv.attempts[prompt])
                if "always500" in prompt:
                    return self._send(500, b'{"error": "boom"}')
                if n == 1 and "dayretry" in prompt:
                    return self._send(429, b'{"error": "come back tomorrow"}', {"Retry-After": "86400"})
                if "forbidden" in prompt:
                    return self._send(403, b'{"error": {"message": "no access to this model"}}')
                if "filter400" in prompt:
                    return self._send(400, b'{"error": {"code": "content_filter", "message": "blocked"}}')
                if "echokey" in prompt:
                    return self._send(400, json.dumps({"error": f"bad request from {self.headers['Authorization']}"})
                                      .encode())
                if "redirect" in prompt:
                    return self._send(307, b"", {"Location": "https://elsewhere.invalid/v1/chat/completions"})
                if "drip" in prompt:
                    payload = json.dumps({"choices": [{"message": {"content": "late"}, "finish_reason": "stop"}],
                                          "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    try:
                        for i in range(0, len(payload), 8):      # each read within the client's timeout
                            self.wfile.write(payload[i:i + 8])
                            self.wfile.flush()
                            time.sleep(0.2)
                    except (BrokenPipeError, ConnectionResetError):
                        pass
                    return
                if "alwayshang" in prompt:
                    time.sleep(2.0)
                    return self._send(503, b'{"error": "too late"}')
                if "slowdrip" in prompt or "slowheaders" in prompt:
                    payload = json.dumps({"choices": [{"message": {"content": "late"}, "finish_reason": "stop"}],
                                          "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()
                    head = (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                            f"Content-Length: {len(payload)}\r\n\r\n").encode()
                    pieces = [head[i:i + 4] for i in range(0, len(head), 4)] + [payload] if "slowheaders" in prompt \
                        else [head] + [payload[i:i + 8] for i in range(0, len(payload), 8)]
                    try:
                        for piece in pieces:                     # each gap just under the client's read timeout
                            self.wfile.write(piece)
                            self.wfile.flush()
                            time.sleep(0.4)
                    except (BrokenPipeError, ConnectionResetError):
                        pass
                    self.close_connection = True
                    return
                if n == 1 and "f429" in prompt:
                    return self._send(429, b'{"error": "slow down"}', {"Retry-After": "1"})
                if n == 1 and "f500" in prompt:
                    return self._send(500, b'{"error": "oops"}')
                if n == 1 and "hang" in prompt:
                    time.sleep(2.0)
                    return self._send(503, b'{"error": "too late"}')
                if n == 1 and "malformed" in prompt:
                    return self._send(200, b'{"choices": [ {"message": ')
                msg = {"role": "assistant", "content": f"echo: {prompt} [{n_images} images]"}
                if "counted" in prompt:            # an answer that differs on every delivery
                    time.sleep(0.3)
                    with srv.lock:
                        srv.deliveries = getattr(srv, "deliveries", 0) + 1
                        msg["content"] += f" #{srv.deliveries}"
                finish = "stop"
                if "refuse" in prompt:
                    msg = {"role": "assistant", "content": None, "refusal": "I can't help with that."}
                if "block" in prompt:
                    msg, finish = {"role": "assistant", "content": ""}, "content_filter"
                if "nullcontent" in prompt and n == 1:
                    msg = {"role": "assistant", "content": None}
                if "listcontent" in prompt:
                    msg = {"role": "assistant", "content": [{"type": "text", "text": "part one, "},
                                                            {"type": "text", "text": "part two"}]}
                usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
                if "nullusage" in prompt:
                    usage = {"prompt_tokens": None, "completion_tokens": 5}
                out = {"id": "x", "object": "chat.completion", "model": body["model"],
                       "choices": [{"index": 0, "message": msg, "finish_reason": finish}], "usage": usage}
                with srv.lock:
                    srv.billed[prompt] = srv.billed.get(prompt, 0) + 1
                self._send(200, json.dumps(out).encode())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = FaultServer()
    yield s
    s.close()


def _backend(url, keys=(GOOD_KEY,), **kw):
    kw = {"timeout_s": 0.5, "max_retries": 3, "backoff_s": 0.05, "price_in": 2.5, "price_out": 10.0, **kw}
    return OpenAICompatibleBackend("mock-gpt", url, keys, **kw)


def _img(seed):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8))


PROMPTS = ["plain one", "plain two", "f429 please", "f500 please", "hang please", "malformed please",
           "refuse please", "block please", "always500 please", "plain one"]  # the last repeats the first


def test_faults_end_answered_or_failed_without_duplicate_spend_and_replay_from_cache(server, tmp_path):
    convs = [[user(_img(i % 3), p)] for i, p in enumerate(PROMPTS)]
    convs[-1] = convs[0]  # an identical request in the same batch
    chat = Chat(_backend(server.url), tmp_path / "cache.sqlite", max_workers=4)
    res = chat.generate_many(convs, GenParams(max_new_tokens=20), progress=False)
    by = dict(zip(PROMPTS, res))
    for p in ("plain one", "plain two", "f429 please", "f500 please", "hang please", "malformed please"):
        assert by[p].status == "ok" and by[p].text == f"echo: {p} [1 images]", (p, by[p])
    assert by["refuse please"].status == "refused" and "can't help" in by["refuse please"].error
    assert by["block please"].status == "blocked"
    assert by["always500 please"].status == "failed" and "HTTP 500" in by["always500 please"].error
    assert by["always500 please"].attempts == 4          # 1 + max_retries
    # Retry-After honoured; the hang ended by the client's timeout, then retried
    t = server.attempts["f429 please"]
    assert len(t) == 2 and t[1] - t[0] >= 0.95
    assert len(server.attempts["hang please"]) == 2
    # no duplicate spend: every prompt billed at most once, the repeated request sent once
    assert max(server.billed.values()) == 1
    assert len(server.attempts["plain one"]) == 1
    assert chat.stats.requests == 9
    ok_calls = sum(r.status != "failed" for r in res[:-1])
    assert chat.stats.prompt_tokens == 10 * ok_calls
    assert chat.stats.cost_usd == pytest.approx(ok_calls * (10 * 2.5 + 5 * 10.0) / 1e6)
    # a second run replays every answer from the cache (refusals and blocks included: they are
    # answers) and asks again only the failed request, which is never stored
    assert ResponseCache(tmp_path / "cache.sqlite").counts() == {"ok": 6, "refused": 1, "blocked": 1}
    before = server.requests
    chat2 = Chat(_backend(server.url), tmp_path / "cache.sqlite")
    res2 = chat2.generate_many(convs, GenParams(max_new_tokens=20), progress=False)
    assert chat2.stats.requests == 1 and server.requests == before + 4      # always500: 1 + 3 retries
    assert [r.text for r in res2] == [r.text for r in res]
    assert [r.from_cache for r in res2] == [p != "always500 please" for p in PROMPTS]
    assert [r.status for r in res2] == [r.status for r in res]


def test_decoding_parameters_and_images_are_part_of_the_key():
    ident = {"model": "m", "revision": "r"}
    m1, m2 = [user(_img(1), "hi")], [user(_img(2), "hi")]
    k = cache_key(ident, m1, GenParams())
    assert k == cache_key(ident, [user(_img(1), "hi")], GenParams())
    assert k != cache_key(ident, m2, GenParams())
    assert k != cache_key(ident, m1, GenParams(temperature=0.7))
    assert k != cache_key({"model": "m", "revision": "r2"}, m1, GenParams())


def test_keys_rotate_past_a_rejected_key_and_never_reach_the_cache(server, tmp_path, monkeypatch):
    monkeypatch.setenv("MOCK_API_KEY_1", BAD_KEY)
    monkeypatch.setenv("MOCK_API_KEY_2", GOOD_KEY)
    keys = api_keys("MOCK_API_KEY", env_file=tmp_path / "missing.env")
    assert keys == [BAD_KEY, GOOD_KEY]
    chat = Chat(_backend(server.url, keys=keys), tmp_path / "c.sqlite")
    res = chat.generate_many([[user(f"plain {i}")] for i in range(6)], progress=False)
    assert all(r.status == "ok" for r in res)
    blob = (tmp_path / "c.sqlite").read_bytes() + b"".join(p.read_bytes() for p in tmp_path.glob("c.sqlite*"))
    assert GOOD_KEY.encode() not in blob and BAD_KEY.encode() not in blob
    # only rejected keys: the request fails, recorded as such
    chat_bad = Chat(_backend(server.url, keys=[BAD_KEY]), None)
    r = chat_bad.generate([user("plain x")])
    assert r.status == "failed" and "rejected" in r.error


def test_dotenv_keys(tmp_path, monkeypatch):
    monkeypatch.delenv("DOTENV_KEY", raising=False)
    (tmp_path / ".env").write_text("# keys\nexport DOTENV_KEY='a1'\nDOTENV_KEY_1=b2\nDOTENV_KEY_2=\"c3\"\n")
    assert read_dotenv(tmp_path / ".env")["DOTENV_KEY"] == "a1"
    assert api_keys("DOTENV_KEY", tmp_path / ".env") == ["a1", "b2", "c3"]


def test_missing_key_is_a_clear_error(server):
    from lib.compendium.presets import PresetError
    with pytest.raises(PresetError, match="api_key_env"):
        OpenAICompatibleBackend("m", server.url, [])


class FlakyBackend:
    """Answers until `crash_after` calls, then raises as a crashing process would."""

    def __init__(self, crash_after=None):
        self.calls = 0
        self.crash_after = crash_after
        self.lock = threading.Lock()

    def identity(self):
        return {"model": "flaky"}

    def complete(self, messages, params):
        with self.lock:
            self.calls += 1
            n = self.calls
        if self.crash_after is not None and n > self.crash_after:
            raise RuntimeError("process died")
        return ChatResult(f"answer to {messages[0]['content'][0]['text']}", model="flaky")


def test_a_crash_mid_run_loses_nothing_already_answered(tmp_path):
    convs = [[user(f"q{i}")] for i in range(40)]
    with pytest.raises(RuntimeError, match="process died"):
        Chat(FlakyBackend(crash_after=15), tmp_path / "c.sqlite", max_workers=2).generate_many(convs, progress=False)
    stored = len(ResponseCache(tmp_path / "c.sqlite"))
    assert stored == 15          # every answer that arrived before the crash is kept
    healthy = FlakyBackend()
    res = Chat(healthy, tmp_path / "c.sqlite", max_workers=2).generate_many(convs, progress=False)
    assert healthy.calls == 40 - stored
    assert [r.text for r in res] == [f"answer to q{i}" for i in range(40)]


def test_concurrent_writers_share_one_cache_file(tmp_path):
    path = tmp_path / "shared.sqlite"
    errors = []

    def writer(w):
        try:
            c = ResponseCache(path)
            for i in range(150):
                c.put(f"{w}-{i}", ChatResult(f"{w}:{i}", model="m"))
        except Exception as e:  # noqa: BLE001 - collected for the assertion
            errors.append(e)
    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    c = ResponseCache(path)
    assert len(c) == 600 and c.get("3-149").text == "3:149"
    # a failure is never stored, so it never overwrites an answer nor replays
    assert c.put("3-149", ChatResult("", "failed", error="x")) is False
    assert c.get("3-149").status == "ok"
    assert c.put("new", ChatResult("", "failed", error="x")) is False and c.get("new") is None
    # a file written before that rule may hold failures: they are not served
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO responses VALUES ('old-failure', 'm', 'failed', 0, ?)",
                   (json.dumps(ChatResult("", "failed", error="x").to_json()),))
    assert c.get("old-failure") is None
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_unknown_chat_preset_lists_known_ones():
    from lib.compendium.presets import PresetError
    with pytest.raises(PresetError, match="gpt-4o"):
        load_chat("gpt-9")


def test_answers_and_errors_are_read_defensively(server, tmp_path):
    waits = []
    b = _backend(server.url, max_backoff_s=0.3, sleep=lambda w: waits.append(w))
    chat = Chat(b, tmp_path / "c.sqlite")
    # a server asking for a day's wait gets max_backoff_s, and the request then succeeds
    r = chat.generate([user("dayretry please")])
    assert r.status == "ok" and waits == [0.3]
    # a 403 is this request's failure, not a rejected key: the key stays in use
    r = chat.generate([user("forbidden please")])
    assert r.status == "failed" and "403" in r.error and b.keys.alive == 1
    assert chat.generate([user("plain after 403")]).status == "ok"
    # a provider's safety signal in a 400 is a block (an answer: cached), not a failure
    r = chat.generate([user("filter400 please")])
    assert r.status == "blocked"
    # null optional usage fields keep the paid answer (one request, no resend)
    before = server.requests
    r = chat.generate([user("nullusage please")])
    assert r.status == "ok" and r.usage["prompt_tokens"] == 0 and server.requests == before + 1
    # an answer with no content is malformed: asked again, never an 'ok' empty answer
    r = chat.generate([user("nullcontent please")])
    assert r.status == "ok" and r.text.startswith("echo: nullcontent") and r.attempts == 2
    # content given as parts is joined
    assert chat.generate([user("listcontent please")]).text == "part one, part two"
    # a redirect is a clear failure, naming where it points
    r = chat.generate([user("redirect please")])
    assert r.status == "failed" and "redirected to" in r.error and "elsewhere.invalid" in r.error
    # a key echoed back by the server is redacted from what is stored and returned
    r = chat.generate([user("echokey please")])
    assert r.status == "failed" and GOOD_KEY not in r.error and "***" in r.error
    blob = b"".join(p.read_bytes() for p in tmp_path.glob("c.sqlite*"))
    assert GOOD_KEY.encode() not in blob
    assert ResponseCache(tmp_path / "c.sqlite").counts() == {"ok": 5, "blocked": 1}


def test_the_timeout_bounds_the_whole_request(server):
    b = _backend(server.url, max_retries=0)      # timeout_s 0.5; each read arrives within it
    t0 = time.time()
    r = Chat(b).generate([user("drip please")])
    drip_s = 0.2 * 15                            # the server takes ~3 s to send the whole body
    assert r.status == "failed" and "within 0.5s" in r.error and time.time() - t0 < drip_s / 2


@pytest.mark.parametrize("fault", ["slowdrip", "slowheaders"])
def test_the_timeout_bounds_a_request_trickled_just_under_each_read_timeout(server, fault):
    b = _backend(server.url, max_retries=0)      # timeout_s 0.5; every byte arrives 0.4 s after the last
    t0 = time.time()
    r = Chat(b).generate([user(f"{fault} please")])
    assert r.status == "failed" and "within 0.5s" in r.error and time.time() - t0 < 0.5 + 0.2


def test_repeated_hangs_end_at_the_calls_total_timeout(server):
    b = _backend(server.url, max_retries=5, total_timeout_s=1.2)    # each attempt would hang 2 s
    t0 = time.time()
    r = Chat(b).generate([user("alwayshang please")])
    assert r.status == "failed" and "total_timeout_s=1.2s is spent" in r.error
    assert time.time() - t0 < 1.2 + 0.35 and len(server.attempts["alwayshang please"]) <= 3


def test_the_endpoint_is_part_of_an_http_models_identity():
    a = OpenAICompatibleBackend("same-name", "http://127.0.0.1:9/v1", api_key_optional=True)
    b = OpenAICompatibleBackend("same-name", "http://127.0.0.1:10/v1", api_key_optional=True)
    assert Chat(a).key([user("q")], GenParams()) != Chat(b).key([user("q")], GenParams())
    served = OpenAICompatibleBackend("same-name", "http://127.0.0.1:9/v1", api_key_optional=True,
                                     identity_extra={"gguf": "abc"})
    moved = OpenAICompatibleBackend("same-name", "http://127.0.0.1:11/v1", api_key_optional=True,
                                    identity_extra={"gguf": "abc"})
    assert Chat(served).key([user("q")], GenParams()) == Chat(moved).key([user("q")], GenParams())


def test_a_corrupt_cache_file_is_named(tmp_path):
    from lib.models.chat import CacheError
    p = tmp_path / "broken.sqlite"
    p.write_bytes(b"this is not a database" * 100)
    with pytest.raises(CacheError, match="broken.sqlite"):
        ResponseCache(p)


def test_identical_requests_from_three_processes_are_sent_once(server, tmp_path):
    import subprocess
    import sys
    from lib import ROOT
    code = ("import json, sys\n"
            "from lib.models.chat import Chat, OpenAICompatibleBackend, user\n"
            f"b = OpenAICompatibleBackend('mock-gpt', '{server.url}', ['{GOOD_KEY}'], timeout_s=5)\n"
            f"chat = Chat(b, '{tmp_path / 'shared.sqlite'}', max_workers=4)\n"
            "res = chat.generate_many([[user(f'counted {i}')] for i in range(12)], progress=False)\n"
            "print(json.dumps([r.text for r in res]))\n")
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    outs = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sum(len(v) for k, v in server.attempts.items() if k.startswith("counted")) == 12   # each paid once
    assert outs[0] == outs[1] == outs[2]                  # every caller got the one answer
    # threads of one process: the same key asked twice at once is sent once
    chat = Chat(_backend(server.url), tmp_path / "threads.sqlite")
    got = []
    threads = [threading.Thread(target=lambda: got.append(chat.generate([user("counted twice")]).text))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(server.attempts["counted twice"]) == 1 and got[0] == got[1]


def test_a_local_models_identity_covers_dtype_and_chat_template(tmp_path):
    from lib.compendium.presets import Preset
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")
    base = Preset("m", "hf", str(tmp_path)).identity()
    assert base != Preset("m", "hf", str(tmp_path), dtype="bfloat16").identity()
    (tmp_path / "chat_template.jinja").write_text("{{ messages }} changed")
    assert Preset("m", "hf", str(tmp_path)).identity()["templates"] != base["templates"]
