"""The served LLM: llama.cpp's server (xllamacpp) with the real SmolLM2-135M-Instruct GGUF from its
wheel, reached through the openai_compatible backend. Health, completion, schema-constrained output,
concurrency, cache replay with zero HTTP requests, a server killed mid-run, process hygiene, reuse."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import jsonschema
import pytest

from lib import ROOT
from lib.models.chat import Chat, GenParams, OpenAICompatibleBackend, ResponseCache, load_backend, load_chat, user
from lib.compendium.presets import get_preset
from lib.models.serve import find_running, port_open, serve, server_answers

PRESET = "smollm2-135m-instruct"
LABEL_SCHEMA = json.loads((ROOT / "params" / "schemas" / "few_shot_label.json").read_text())
CUES_SCHEMA = json.loads((ROOT / "params" / "schemas" / "arcade_rapid_scan.json").read_text())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it holds no port and runs nothing
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _counting(backend):
    """Count the HTTP requests a backend's client sends."""
    sent = []
    backend._client.event_hooks["request"].append(lambda req: sent.append(req.url.path))
    return sent


@pytest.fixture(scope="module")
def served():
    with serve(PRESET, reuse=False) as srv:
        yield srv


def test_health_and_one_completion(served, tmp_path):
    assert server_answers(served.base_url, served.model)
    chat = load_chat(PRESET, cache=tmp_path / "c.sqlite", base_url=served.base_url)
    r = chat.generate([user("Name one colour of the sky. Answer in one word.")], GenParams(max_new_tokens=8))
    assert r.status == "ok" and r.text.strip()
    assert r.usage["prompt_tokens"] > 5 and 0 < r.usage["completion_tokens"] <= 8
    assert r.finish_reason in ("stop", "length")


def test_schema_constrained_output_parses(served, tmp_path):
    chat = load_chat(PRESET, cache=tmp_path / "c.sqlite", base_url=served.base_url)
    assert chat.native_schema
    convs = [[user(f"Is this meme hateful? Its text: 'the {w} people of the valley are here'")]
             for w in ("blue", "green", "tall", "quiet")]
    res = chat.generate_many(convs, GenParams(max_new_tokens=120, json_schema=LABEL_SCHEMA), progress=False)
    for r in res:
        assert r.status == "ok", r
        assert json.loads(r.text) == r.parsed and r.parsed["label"] in ("hateful", "non-hateful")
    cues = chat.generate(convs[0], GenParams(max_new_tokens=400, json_schema=CUES_SCHEMA))
    assert cues.status == "ok" and isinstance(cues.parsed["cues"], list) and len(cues.parsed["cues"]) <= 2
    choice = chat.generate(convs[1], GenParams(max_new_tokens=30, choices=("hateful", "non-hateful")))
    assert choice.status == "ok" and choice.parsed in ("hateful", "non-hateful")
    # the schema is part of the key: the same conversation without it is another request
    assert chat.key(convs[0], GenParams(max_new_tokens=120)) != chat.key(convs[0], GenParams(max_new_tokens=120,
                                                                                             json_schema=LABEL_SCHEMA))


def test_compact_mode_answers_one_line_json_valid_against_the_schema(served, tmp_path):
    """llama.cpp's server reads the compact grammar (llguidance): the answer fits the schema and has
    no whitespace between JSON tokens, so it equals its own compact serialisation."""
    backend = OpenAICompatibleBackend(served.model, served.base_url, api_key_optional=True,
                                      structured_output="llguidance_compact")
    chat = Chat(backend, cache=ResponseCache(tmp_path / "c.sqlite"))
    convs = [[user(f"Is this meme hateful? Its text: 'the {w} people of the valley are vermin'")]
             for w in ("blue", "green", "tall")]
    for schema, n in ((LABEL_SCHEMA, 120), (CUES_SCHEMA, 400)):
        for r in chat.generate_many(convs, GenParams(max_new_tokens=n, json_schema=schema), progress=False):
            if r.finish_reason == "length":          # cut at the cap: nothing to check about its layout
                continue
            assert r.status == "ok", r
            jsonschema.validate(r.parsed, schema)
            assert r.text == json.dumps(r.parsed, ensure_ascii=False, separators=(",", ":"))


def test_requests_in_flight_are_batched_by_the_server(served):
    backend = load_backend(get_preset("chat", PRESET), base_url=served.base_url)
    chat = Chat(backend, cache=None, max_workers=8)
    convs = [[user(f"Count from {i} to {i + 30}, separated by commas.")] for i in range(8)]
    t0 = time.perf_counter()
    res = chat.generate_many(convs, GenParams(max_new_tokens=40), progress=False)
    wall = time.perf_counter() - t0
    assert all(r.status == "ok" for r in res)
    # served one at a time, the latencies would add up to the wall time; in flight together they overlap
    assert sum(r.latency_s for r in res) > 2.0 * wall


def test_cache_replays_a_second_run_with_zero_http_requests(served, tmp_path):
    convs = [[user(f"Give one word that rhymes with {w}.")] for w in ("cat", "tree", "stone", "cat")]
    first = load_chat(PRESET, cache=tmp_path / "c.sqlite", base_url=served.base_url)
    sent = _counting(first.backend)
    a = first.generate_many(convs, GenParams(max_new_tokens=10), progress=False)
    assert len(sent) == 3 and first.stats.requests == 3          # the repeated conversation is sent once
    # another process, another port: the identity holds the weights' digest, not the address
    ident = first.backend.identity()
    assert ident["gguf"] and "llama.cpp" in ident["engine"] and "127.0.0.1" not in json.dumps(ident)
    second = load_chat(PRESET, cache=tmp_path / "c.sqlite", base_url="http://127.0.0.1:9/v1")
    sent2 = _counting(second.backend)
    b = second.generate_many(convs, GenParams(max_new_tokens=10), progress=False)
    assert sent2 == [] and second.stats.requests == 0 and second.stats.cache_hits == 3
    assert [r.text for r in b] == [r.text for r in a] and all(r.from_cache for r in b)


def test_a_server_killed_mid_run_gives_failed_and_caches_nothing_for_it(tmp_path):
    cache = ResponseCache(tmp_path / "c.sqlite")
    with serve(PRESET, reuse=False, n_parallel=2) as srv:
        backend = load_backend(get_preset("chat", PRESET), base_url=srv.base_url)
        backend.max_retries, backend.backoff_s = 1, 0.05
        chat = Chat(backend, cache, max_workers=2)
        convs = [[user(f"Write a long story about a lighthouse keeper named Ana, chapter {i}.")] for i in range(10)]
        out = {}
        worker = threading.Thread(target=lambda: out.setdefault("res", chat.generate_many(
            convs, GenParams(max_new_tokens=120), progress=False)))
        worker.start()
        deadline = time.time() + 120
        while len(cache) < 1 and time.time() < deadline:      # at least one answer arrived
            time.sleep(0.05)
        os.kill(srv.pid, signal.SIGKILL)                      # the server dies with requests in flight
        worker.join(120)
    res = out["res"]
    ok = [r for r in res if r.status == "ok"]
    failed = [r for r in res if r.status == "failed"]
    assert ok and failed and len(ok) + len(failed) == len(convs)
    assert all("transport error" in r.error or "gave up" in r.error for r in failed), [r.error for r in failed]
    assert len(cache) == len(ok) and cache.counts() == {"ok": len(ok)}   # nothing cached for the failures
    # the next run re-asks exactly the failed requests
    replay = Chat(backend, cache)
    for c, r in zip(convs, res):
        hit = replay._lookup(replay.key(c, GenParams(max_new_tokens=120)))
        assert (hit is not None) == (r.status == "ok")


def test_the_context_manager_leaves_no_process_and_no_port(tmp_path):
    with pytest.raises(RuntimeError, match="inside the block"):
        with serve(PRESET, reuse=False, n_parallel=1) as srv:
            pid, port = srv.pid, int(srv.base_url.rsplit(":", 1)[1].split("/")[0])
            assert _alive(pid) and port_open("127.0.0.1", port)
            raise RuntimeError("an error inside the block")
    assert not _alive(pid) and not port_open("127.0.0.1", port)
    # a Ctrl-C in the block (KeyboardInterrupt) stops it the same way
    with pytest.raises(KeyboardInterrupt):
        with serve(PRESET, reuse=False, n_parallel=1) as srv:
            pid = srv.pid
            raise KeyboardInterrupt
    assert not _alive(pid)


def test_a_killed_parent_leaves_no_orphan_server(tmp_path):
    code = ("import sys, time; from lib.models.serve import serve\n"
            "with serve('smollm2-135m-instruct', reuse=False, n_parallel=1) as s:\n"
            "    print(s.pid, s.base_url, flush=True); time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        pid_s, url = parent.stdout.readline().split()
        pid = int(pid_s)
        assert _alive(pid) and server_answers(url)
        parent.kill()                                         # no chance to clean up
        parent.wait(10)
        deadline = time.time() + 15
        while _alive(pid) and time.time() < deadline:
            time.sleep(0.1)
        assert not _alive(pid), "the server outlived its parent"
    finally:
        parent.kill()


def test_a_second_start_reuses_the_running_server(served):
    with serve(PRESET) as again:
        assert again.base_url == served.base_url and not again.owned
    assert server_answers(served.base_url)                    # leaving the inner block did not stop it
    # another process finds it through the state files: a server of this preset that answers, and this one among
    # those it can see (a stage of make test's other lane may be serving the same preset meanwhile)
    out = subprocess.run([sys.executable, "-c", "from lib.models.serve import find_running, _running_states; "
                          f"s = find_running('{PRESET}'); print(s.base_url if s else None); "
                          f"print(*[st['base_url'] for st in _running_states('{PRESET}')])"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    found, seen = out.stdout.strip().splitlines()
    assert served.base_url in seen.split() and server_answers(found)
    assert find_running(PRESET).base_url == served.base_url


def test_standalone_command_serves_until_interrupted(tmp_path):
    from lib.models.serve import free_port
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "lib.models.serve", "--preset", PRESET, "--port", str(port),
                             "--n-parallel", "1"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    try:
        line = proc.stdout.readline()
        assert f"http://127.0.0.1:{port}/v1" in line
        assert server_answers(f"http://127.0.0.1:{port}/v1", get_preset("chat", PRESET).model)
        proc.send_signal(signal.SIGINT)                       # Ctrl-C
        assert proc.wait(20) == 0
        assert not port_open("127.0.0.1", port)
    finally:
        proc.kill()


class _Impostor:
    """Another process's server on a port: answers /health and /v1/models with the preset's model name."""

    def __init__(self, model):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class H(BaseHTTPRequestHandler):
            def do_GET(self):
                body = json.dumps({"status": "ok", "data": [{"id": model}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("race", [False, True])
def test_serve_never_hands_back_another_processs_server_as_its_own(monkeypatch, race):
    """serve(port=P, reuse=False) with another process answering on P: an error naming the port,
    before anything starts (race=False); or, when the port looked free and was taken before the
    server bound it (race=True), an error once the started server exits, never the other one."""
    from lib.models import serve as serve_mod
    from lib.models.serve import ServeError, alias
    impostor = _Impostor(alias(get_preset("chat", PRESET)))
    try:
        if race:
            real = serve_mod.port_open
            monkeypatch.setattr(serve_mod, "port_open",
                                lambda host, port, timeout=0.2: False if port == impostor.port else real(host, port, timeout))
        with pytest.raises(ServeError, match=rf"127.0.0.1:{impostor.port} is already in use|exited with code"):
            with serve(PRESET, port=impostor.port, reuse=False) as s:
                pytest.fail(f"handed back {s}")
        assert server_answers(f"http://127.0.0.1:{impostor.port}/v1")        # the other server is untouched
    finally:
        impostor.close()
