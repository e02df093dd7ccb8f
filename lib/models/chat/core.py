"""`Chat`: a backend behind the response cache, with batching, structured-output checks and retries."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Sequence

from tqdm.auto import tqdm

from lib.models.chat.cache import ResponseCache
from lib.models.chat.messages import ChatResult, GenParams, assistant, cache_key, user
from lib.models.chat.structured import parse_structured, storable, with_schema_instruction
from lib.compendium.presets import options_from
from lib.compendium.prompts import prompt_template


class ChatBackend(Protocol):
    """What a chat backend provides. Optional: `complete_batch(conversations, params)` (local models
    generating several conversations in one call) and `native_schema` (True when the backend
    constrains decoding to `params.schema()` itself, as llama.cpp, vLLM and OpenAI do)."""

    def identity(self) -> dict[str, Any]: ...          # model id + revision (+ weights digest): cache key

    def complete(self, messages: Sequence[dict[str, Any]], params: GenParams) -> ChatResult: ...


@dataclass
class ChatOptions:
    """Preset options that size a `Chat`; None takes the backend class's `default_max_workers` /
    `default_batch_size` (local models batch, HTTP models fan out over threads)."""
    max_workers: int | None = None
    batch_size: int | None = None      # > 1: a local backend generates this many conversations per call
    schema_retries: int = 2

    @classmethod
    def from_options(cls, options: dict[str, Any], who: str = "chat preset") -> "ChatOptions":
        return options_from(cls, options, who)


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
            return [storable(r) for r in out]
        out = []
        for m in conversations:
            t1 = time.perf_counter()
            r = self.backend.complete(m, params)
            r.latency_s = r.latency_s or (time.perf_counter() - t1)
            out.append(storable(r))
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
