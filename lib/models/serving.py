"""Serving benchmark: the served GGUF (llama.cpp's server) against the same GGUF run by transformers.

    python -m lib.models.serving --profile embedded          # also a stage of `make reproduce` / `make test`

One run, one machine, side by side, the same prompts and greedy decoding:
- completion tokens/s and requests/s with 1, 2, 4, 8 requests in flight through the served
  model (OpenAI-compatible HTTP, the server's slots batching them), against the same GGUF
  loaded by transformers (`gguf_file=`, dequantized to float32) through the `hf` chat backend,
  its "concurrency" being the generate batch;
- the prompt-prefix cache on a k-shot prompt: time to first token with a prefix the server
  has not seen (cold) and with the same prefix and another query (warm);
- the share of answers that match a schema with and without constrained decoding, on the
  schemas the few-shot agents and the debate use (params/schemas/).

Timed calls bypass the response cache (they are what is measured). The stage is cached on its
inputs instead: a rerun with the same parameters, weights and engine reuses metrics.json
(`--force` measures again). Results: artifacts/<profile>/serving/metrics.json, the figure
figures/<profile>/serving_throughput.png.
"""
from __future__ import annotations

import argparse
import json
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lib import ROOT
from lib.evaluation import plotting
from lib.compendium.artifacts import (mark_reused, read_json, read_jsonl, stage_dir, write_json, write_manifest,
                                      write_metrics)
from lib.models.chat import (Chat, GenParams, OpenAICompatibleBackend, assistant, load_backend, parse_structured,
                      prompt_template, served_identity, system, user, with_schema_instruction)
from lib.compendium.params import validate_profile
from lib.compendium.presets import get_preset
from lib.models.serve import serve

STAGE = "serving"
SCHEMAS_DIR = ROOT / "params" / "schemas"


@dataclass
class Config:
    """Parameters of the serving benchmark (profile section `serving`)."""
    served_preset: str = "smollm2-135m-instruct"       # a chat preset with a serve: section
    hf_preset: str = "smollm2-135m-instruct-hf"        # the same weights through transformers ("" skips it)
    concurrency: list = field(default_factory=lambda: [1, 2, 4, 8])   # requests in flight (served)
    hf_concurrency: list = field(default_factory=lambda: [1, 4])      # generate batch sizes (transformers)
    n_requests: int = 24             # requests per served concurrency level
    hf_requests: int = 8             # requests per transformers level (it is the slow side)
    max_new_tokens: int = 64
    shots: int = 4                   # exemplars in the prefix-cache prompt
    prefix_trials: int = 3           # cold/warm pairs, each with a prefix of its own
    schemas: list = field(default_factory=lambda: ["few_shot_label", "arcade_rapid_scan"])  # params/schemas/*.json
    schema_prompts: int = 12         # prompts per schema and arm
    schema_max_new_tokens: int = 320
    seed: int = 0


def load_schema(name: str) -> dict[str, Any]:
    path = SCHEMAS_DIR / f"{name}.json"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in SCHEMAS_DIR.glob("*.json")))
        raise FileNotFoundError(f"no schema {path.relative_to(ROOT)} (known: {known})")
    return json.loads(path.read_text(encoding="utf-8"))


def meme_texts(profile: str, n: int) -> list[str]:
    """Meme texts for prompts: MemeWorld's (or the profile's FHM) test memes, in file order."""
    mw = stage_dir(profile, "00_data_prep", create=False) / "memeworld" / "memeworld.jsonl"
    if mw.exists():
        rows = read_jsonl(mw)
        texts = [str(r["text"]) for r in rows if r.get("split", "").startswith("test") and r.get("text")]
        if len(texts) >= n:
            return texts[:n]
    # no MemeWorld (a profile without it): neutral texts, so the benchmark still measures the server
    return [f"meme number {i}: the weather today is strange" for i in range(n)]


def _conversations(texts: list[str], template: str) -> list[list[dict[str, Any]]]:
    return [[user(template.format(text=t))] for t in texts]


def throughput(chat: Chat, conversations: list, params: GenParams, concurrency: int) -> dict[str, float]:
    """Completion tokens/s and requests/s with `concurrency` requests in flight (HTTP) or per batch (local)."""
    chat.batch_size = concurrency
    t0 = time.perf_counter()
    res = chat.generate_many(conversations, params, max_workers=concurrency, progress=False)
    wall = time.perf_counter() - t0
    bad = [r for r in res if r.status != "ok"]
    if bad:
        raise RuntimeError(f"throughput run at concurrency {concurrency}: {len(bad)} requests did not succeed "
                           f"(first: {bad[0].status}: {bad[0].error})")
    tokens = sum(r.usage.get("completion_tokens", 0) for r in res)
    return {"tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall, "requests_per_s": len(res) / wall,
            "texts": [r.text for r in res]}


def prefix_cache_effect(backend: OpenAICompatibleBackend, texts: list[str], shots: int, trials: int) -> dict[str, float]:
    """Time to first token (a 1-token completion) for a k-shot prompt: cold prefix vs warm prefix."""
    instr = prompt_template("benchmark/few_shot_system.txt")
    cold, warm, cached_cold, cached_warm, prompt_tokens = [], [], [], [], []
    for t in range(trials):
        base = texts[t * (shots + 2):(t + 1) * (shots + 2)]
        msgs: list[dict[str, Any]] = [system(f"[session {t}] " + instr)]   # a prefix no earlier request had
        for i, ex in enumerate(base[:shots]):
            msgs += [user(f"Meme text: {ex}"), assistant("hateful" if i % 2 else "non-hateful")]
        p = GenParams(max_new_tokens=1, temperature=0.0)
        for bucket, cbucket, query in ((cold, cached_cold, base[shots]), (warm, cached_warm, base[shots + 1])):
            r = backend.complete(msgs + [user(f"Meme text: {query}")], p)
            if r.status != "ok":
                raise RuntimeError(f"prefix-cache request failed: {r.error}")
            bucket.append(r.latency_s)
            cbucket.append(r.usage.get("cached_tokens", 0))
            prompt_tokens.append(r.usage.get("prompt_tokens", 0))
    n = max(1, len(cold))
    return {"ttft_cold_s": sum(cold) / n, "ttft_warm_s": sum(warm) / n,
            "prefix_cached_tokens_cold": sum(cached_cold) / n, "prefix_cached_tokens_warm": sum(cached_warm) / n,
            "prefix_prompt_tokens": sum(prompt_tokens) / max(1, len(prompt_tokens))}


def schema_valid_rates(chat: Chat, schema: dict[str, Any], texts: list[str], max_new_tokens: int) -> dict[str, Any]:
    """Share of answers matching `schema`: constrained decoding (with) vs the same prompt unconstrained (without)."""
    task = prompt_template("benchmark/schema_task.txt")
    sp = GenParams(max_new_tokens=max_new_tokens, json_schema=schema)
    convs = [with_schema_instruction([user(task.format(text=t))], sp) for t in texts]
    with_ = chat.generate_many(convs, sp, progress=False)
    without = chat.generate_many(convs, GenParams(max_new_tokens=max_new_tokens), progress=False)
    ok_with = [r.status == "ok" and r.parsed is not None for r in with_]
    ok_without = [r.status == "ok" and parse_structured(r.text, sp)[1] is None for r in without]
    return {"with": sum(ok_with) / len(texts), "without": sum(ok_without) / len(texts), "n": len(texts),
            "example_with": with_[0].text, "example_without": without[0].text}


def _sweep(chat: Chat, engine: str, levels: list, conversations: list, params: GenParams,
           details: dict[str, Any], m: dict[str, Any], progress: bool) -> None:
    """Throughput at each concurrency level, into details[engine] and the metrics (`..._{engine}_c{level}`)."""
    for c in levels:
        r = throughput(chat, conversations, params, c)
        details[engine][c] = r
        m[f"tokens_per_s_{engine}_c{c}"] = r["tokens_per_s"]
        m[f"requests_per_s_{engine}_c{c}"] = r["requests_per_s"]
        if progress:
            print(f"{engine} c{c}: {r['tokens_per_s']:.1f} tokens/s, {r['requests_per_s']:.2f} requests/s", flush=True)


def run(profile: str, cfg: Config, progress: bool = True) -> dict[str, Any]:
    served_preset = get_preset("chat", cfg.served_preset)
    need = max(cfg.n_requests, cfg.hf_requests, cfg.schema_prompts, cfg.prefix_trials * (cfg.shots + 2))
    texts = meme_texts(profile, need)
    gen_template = prompt_template("benchmark/throughput_task.txt")
    params = GenParams(max_new_tokens=cfg.max_new_tokens, temperature=0.0, seed=cfg.seed)
    m: dict[str, Any] = {}
    details: dict[str, Any] = {"served": {}, "hf": {}}
    with serve(cfg.served_preset, reuse=False) as srv:
        backend = load_backend(served_preset, base_url=srv.base_url)
        chat = Chat(backend, cache=None, max_workers=max(cfg.concurrency), name=cfg.served_preset)
        chat.generate_many(_conversations(texts[:2], gen_template), params, progress=False)   # warm-up
        _sweep(chat, "served", cfg.concurrency, _conversations(texts[:cfg.n_requests], gen_template), params,
               details, m, progress)
        m.update(prefix_cache_effect(backend, texts, cfg.shots, cfg.prefix_trials))
        for name in cfg.schemas:
            s = schema_valid_rates(chat, load_schema(name), texts[:cfg.schema_prompts], cfg.schema_max_new_tokens)
            details[f"schema_{name}"] = s
            m[f"schema_valid_rate_with_schema_{name}"] = s["with"]
            m[f"schema_valid_rate_without_schema_{name}"] = s["without"]
        if cfg.schemas:
            m["schema_valid_rate_with_schema"] = sum(m[f"schema_valid_rate_with_schema_{n}"] for n in cfg.schemas) / len(cfg.schemas)
            m["schema_valid_rate_without_schema"] = sum(m[f"schema_valid_rate_without_schema_{n}"]
                                                        for n in cfg.schemas) / len(cfg.schemas)
            m["schema_n_per_arm"] = cfg.schema_prompts * len(cfg.schemas)
    if cfg.hf_preset:
        hf = Chat(load_backend(get_preset("chat", cfg.hf_preset), device="cpu"), cache=None, name=cfg.hf_preset)
        hf.generate_many(_conversations(texts[:1], gen_template), params, progress=False)      # warm-up
        _sweep(hf, "hf", cfg.hf_concurrency, _conversations(texts[:cfg.hf_requests], gen_template), params,
               details, m, progress)
        for c in cfg.hf_concurrency:
            if c in cfg.concurrency:
                m[f"speedup_served_vs_hf_c{c}"] = m[f"tokens_per_s_served_c{c}"] / m[f"tokens_per_s_hf_c{c}"]
        # same greedy decoding: how many answers (of the first hf_requests) agree word for word
        same = [a == b for a, b in zip(details["served"][cfg.concurrency[0]]["texts"][:cfg.hf_requests],
                                       details["hf"][cfg.hf_concurrency[0]]["texts"])]
        m["greedy_agreement_served_vs_hf"] = sum(same) / max(1, len(same))
    if 1 in cfg.concurrency and 4 in cfg.concurrency:
        m["served_scaling_c4_vs_c1"] = m["tokens_per_s_served_c4"] / m["tokens_per_s_served_c1"]
    m["max_new_tokens"] = cfg.max_new_tokens
    m["n_requests"] = cfg.n_requests
    return {"metrics": m, "details": details}


def throughput_figure(metrics: dict[str, Any], served_preset: str = "served model"):
    """Completion tokens/s per concurrency level, served vs transformers (levels read from the metrics' keys)."""
    import matplotlib.pyplot as plt
    levels = sorted({int(m.group(1)) for k in metrics for m in [re.match(r"tokens_per_s_(?:served|hf)_c(\d+)$", k)] if m})
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    width = 0.38
    xs = range(len(levels))
    served = [metrics.get(f"tokens_per_s_served_c{c}", 0.0) for c in levels]
    hf = [metrics.get(f"tokens_per_s_hf_c{c}", 0.0) for c in levels]
    ax.bar([x - width / 2 for x in xs], served, width, label="llama.cpp server (GGUF Q4_1, HTTP)")
    ax.bar([x + width / 2 for x in xs], hf, width, label="transformers (same GGUF, dequantized)")
    for x, v in zip(xs, hf):
        if v == 0:
            ax.text(x + width / 2, 1, "not run", rotation=90, ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs), [str(c) for c in levels])
    ax.set_xlabel("requests in flight (transformers: generate batch)")
    ax.set_ylabel("completion tokens / s")
    ax.set_title(f"{served_preset}: throughput on this machine", fontsize=11)
    ax.legend(loc="upper left", fontsize=8, frameon=True)
    ax.set_ylim(0, max(served + hf + [1.0]) * 1.3)
    return fig


def figure(profile: str, metrics: dict[str, Any], cfg: Config) -> list[Path]:
    import matplotlib.pyplot as plt
    plotting.setup()
    fig = throughput_figure(metrics, cfg.served_preset)
    paths = plotting.save_figure(fig, "serving_throughput", profile)
    plt.close(fig)
    return paths


def metrics_markdown(m: dict[str, Any], machine: str) -> str:
    """The serving metrics as docs/models-and-serving.md shows them: tokens per second by requests in flight for
    both engines, the prefix cache's effect, the schema-valid rates and the engines' greedy agreement."""
    levels = sorted(int(k.rsplit("_c", 1)[1]) for k in m if k.startswith("tokens_per_s_served_c"))
    hf = {c: m.get(f"tokens_per_s_hf_c{c}") for c in levels}
    out = [f"On {machine}; {m.get('n_requests', '?')} prompts per level, {m.get('max_new_tokens', '?')} new tokens:\n",
           "| completion tokens / s | " + " | ".join(f"{c} in flight" for c in levels) + " |",
           "|---|" + "---|" * len(levels),
           "| llama.cpp server (GGUF Q4_1, HTTP) | " + " | ".join(f"{m[f'tokens_per_s_served_c{c}']:.1f}"
                                                           for c in levels) + " |",
           "| transformers, the same GGUF dequantized (batch = in flight) | "
           + " | ".join(f"{hf[c]:.1f}" if hf[c] is not None else "" for c in levels) + " |", ""]
    sp = [f"{m[k]:.1f}x at {k.rsplit('_c', 1)[1]} in flight" for k in sorted(m) if k.startswith("speedup_served_vs_hf_c")]
    out.append(f"The server against transformers: {', '.join(sp)}; 4 requests in flight give "
               f"{m.get('served_scaling_c4_vs_c1', float('nan')):.2f}x the throughput of one. A 4-shot prompt of "
               f"{m.get('prefix_prompt_tokens', float('nan')):.0f} tokens: time to first token "
               f"{m.get('ttft_cold_s', float('nan')):.2f} s cold and {m.get('ttft_warm_s', float('nan')):.3f} s warm, with "
               f"{m.get('prefix_cached_tokens_warm', float('nan')):.0f} prompt tokens taken from the prefix cache. Answers "
               f"valid against the few-shot label and rapid-scan schemas: {m.get('schema_valid_rate_with_schema', 0):.0%} with "
               f"constrained decoding, {m.get('schema_valid_rate_without_schema', 0):.0%} without (of "
               f"{m.get('schema_n_per_arm', '?')} per arm). Greedy outputs of the two engines agree word for word on "
               f"{m.get('greedy_agreement_served_vs_hf', float('nan')):.0%} of the prompts (4-bit kernels against "
               f"dequantized float32).")
    return "\n".join(out)


def _fingerprint(cfg: Config) -> dict[str, Any]:
    return {"config": asdict(cfg), "served": served_identity(get_preset("chat", cfg.served_preset)),
            "prompts": [prompt_template(f"benchmark/{n}") for n in
                        ("throughput_task.txt", "few_shot_system.txt", "schema_task.txt")],
            "schemas": {n: load_schema(n) for n in cfg.schemas}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Serving benchmark: llama.cpp server vs transformers, same GGUF.")
    ap.add_argument("--profile", default="embedded")
    ap.add_argument("--force", action="store_true", help="measure again even if the inputs are unchanged")
    args = ap.parse_args(argv)
    cfg = Config(**validate_profile(args.profile)[STAGE])
    out = stage_dir(args.profile, STAGE)
    fp = _fingerprint(cfg)
    write_json(out / "settings.json", asdict(cfg))           # what the figure names the served model by
    done = out / "fingerprint.json"
    if not args.force and done.exists() and (out / "metrics.json").exists() and read_json(done) == json.loads(
            json.dumps(fp)):
        print(f"serving benchmark: inputs unchanged, reusing {out.relative_to(ROOT)}/metrics.json (--force re-measures)")
        mark_reused(out, "inputs unchanged (fingerprint.json): the measured metrics.json stands")
        return 0
    t0 = time.time()
    result = run(args.profile, cfg)
    write_json(out / "details.json", json.loads(json.dumps(result["details"], default=str)))
    write_metrics(args.profile, STAGE, result["metrics"])
    figure(args.profile, result["metrics"], cfg)
    write_manifest(out, asdict(cfg), outputs=["metrics.json", "details.json", "settings.json"])
    write_json(done, fp)
    for k, v in result["metrics"].items():
        print(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}")
    print(f"serving benchmark done in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
