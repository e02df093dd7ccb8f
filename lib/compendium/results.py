"""The committed results (results/<profile>/) and what is generated from them.

`make reproduce` writes a run's working copy under artifacts/<profile>/; for a published profile it then
copies each finished stage's metrics and per-item files here (publish_stage: compared with the committed
ones first, machine paths made relative), the model answers its stages used, its timings and the digests
of the saved notebooks (publish_run). The README's findings and timings blocks and docs/results.md are
generated from these files alone (`make results`), so what a reader sees is what the run committed.
"""
from __future__ import annotations

import argparse
import csv
import fnmatch
import gzip
import hashlib
import json
import math
import os
import platform
import re
from pathlib import Path
from typing import Any, Sequence

from lib import ROOT
from lib.compendium.artifacts import ARTIFACTS_ROOT, RESULTS_ROOT, read_json, write_bytes, write_json, write_text
from lib.compendium import numerics
from lib.compendium.bookkeeping import TIMING, same_result  # noqa: F401  (results.TIMING as before)
from lib.compendium.inputs import publish_figure_images
from lib.models.chat.cache import ResponseCache, default_cache_path
from lib.compendium.costs import Assumptions, cost_rows, markdown
from lib.compendium.findings import findings_block, findings_page, findings_rows  # noqa: F401  (results.findings_rows as before)
from lib.evaluation.plan_page import plan_page
from lib.evaluation.preconditions import precondition_block
from lib.compendium.params import ProfileError, load_profile, section_digest, stages



def machine_description() -> str:
    """The system, the CPU (its model name: CPU-trained models differ in floating point between kinds), the GPU."""
    cpu = next((ln.split(":", 1)[1].strip() for ln in (Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
                if Path("/proc/cpuinfo").exists() else []) if ln.startswith("model name")),
               platform.processor() or platform.machine())
    try:
        import torch
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    except Exception:  # torch missing or broken: the table still renders
        gpu = "unknown accelerator"
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores ({cpu}), {gpu}; {numerics.short()}"


def results_dir(profile: str) -> Path:
    """The committed results of a published profile: the source of truth of its figures, README
    tables and saved notebooks (artifacts/<profile>/ is the working copy a run writes)."""
    return RESULTS_ROOT / profile


def cache_export_path(profile: str) -> Path:
    """The committed model answers of a profile (gzipped JSON lines; lib.models.chat.cache.export)."""
    return results_dir(profile) / "cache" / "responses.jsonl.gz"


def timings_path(profile: str) -> Path:
    return results_dir(profile) / "timings.json"


#: Each stage's results as committed under results/<profile>/<stage>/: globs relative to the stage's
#: artifacts folder. What the figures, the README, the saved notebooks and the checks of `make test`
#: read (metrics, claims and seeds tables, per-item predictions), never models, images or caches.
RESULT_FILES: dict[str, tuple[str, ...]] = {
    "00_data_prep": ("metrics.json", "counts.csv", "memes.csv", "gallery.json", "memeworld/datasheet.json"),
    "models": ("metrics.json", "models.json", "*/training.json", "eval_*.jsonl"),
    "01_captioning": ("metrics.json", "examples.json", "captioned.csv", "caption_scores.csv", "box_scores.csv",
                      "interplay_check.csv"),
    "02_finetuning": ("metrics.json", "ablation.csv", "per_type.csv", "seeds.csv", "selected_share.csv",
                      "variants.json", "runs/*/result.json", "runs/*/predictions.csv",
                      "runs/*/config.json", "claims.csv", "runs_*/*/result.json", "runs_*/*/predictions.csv",
                      "runs_*/*/config.json", "probe.csv", "probe_items.csv"),
    "03_clip4dm": ("metrics.json", "settings.json", "ablation.csv", "by_encoder.csv", "epsilon_sweep.csv",
                   "examples.json", "foil_table.csv", "hard_negatives.csv", "claims.csv", "results_*.csv", "*/results_*.csv",
                   "*/metrics.json"),
    "serving": ("metrics.json", "details.json", "settings.json"),
    "04_few_shot": ("metrics.json", "results.json", "predictions_*.jsonl", "claims.csv", "cold_runs.csv",
                    "table3.json", "agent_outputs.jsonl", "references_*.json", "settings.json", "coherence.csv",
                    "exemplars_*.json", "retrieval.csv", "adapted.json", "claims_adapted.csv"),
    "05_debate": ("metrics.json", "settings.json", "results_*.jsonl", "eval_*.json", "claims.csv", "cold_runs.csv",
                  "adapted_judge.json", "claims_adapted.csv"),
    "06_evaluation": ("metrics.json", "comparison.csv", "predictions_common.csv", "mcnemar*.csv", "injection*.csv", "confounders.csv",
                      "common.json", "gallery.json"),
    "07_figures": (),
}

#: per-item files committed gzipped (results/<profile>/<stage>/<name>.gz; pandas and the checks read either):
#: the large tables no figure reads
RESULT_GZIP: dict[str, tuple[str, ...]] = {
    "02_finetuning": ("runs/*/predictions.csv", "runs_*/*/predictions.csv", "probe_items.csv"),
    "03_clip4dm": ("results_hat.csv", "results_richhf.csv", "results_seetrue.csv"),
}

#: a cap on everything under results/<profile>/ (the committed answers included); publish_run says when it is passed
SIZE_CAP_MB = 30

#: `make reproduce`'s budget for the full embedded run on 2 cores
BUDGET_S = 4 * 3600
#: files a stage writes for its own use that no check reads (never committed): a rerun check's output
EXCLUDED = ("results_rerun_check.jsonl", "eval_rerun_check.json")


def _scrubbed(path: Path) -> bytes:
    """A result file's bytes with the repository's absolute path made relative (results carry no machine paths)."""
    data = path.read_bytes()
    if path.suffix in (".json", ".jsonl", ".csv", ".txt"):
        data = data.replace((str(ROOT) + "/").encode(), b"").replace(str(ROOT).encode(), b".")
    return data


def stage_result_files(profile: str, stage: str) -> dict[str, Path]:
    """The stage's result files in artifacts/<profile>/<stage>/: relative name -> path."""
    src = ARTIFACTS_ROOT / profile / stage
    out: dict[str, Path] = {}
    for pattern in RESULT_FILES.get(stage, ()):
        for f in sorted(src.glob(pattern)):
            if f.is_file() and f.name not in EXCLUDED and not f.name.startswith("."):
                out[f.relative_to(src).as_posix()] = f
    return out


def publish_stage(profile: str, stage: str) -> list[str]:
    """Copy a finished stage's result files to results/<profile>/<stage>/ (each atomically; absolute paths
    made relative) and remove committed files of that stage the run no longer wrote. Prints how the new
    metrics compare with the committed ones first. Returns the relative names written."""
    files = stage_result_files(profile, stage)
    dest = results_dir(profile) / stage
    if (dest / "metrics.json").exists() and "metrics.json" in files:
        for line in compare_metrics(read_json(dest / "metrics.json"), read_json(files["metrics.json"]),
                                    seed_spread(profile, stage)):
            print(f"   {stage}: {line}")
    written = {}
    for rel, f in files.items():
        data = _scrubbed(f)
        if any(fnmatch.fnmatch(rel, pat) for pat in RESULT_GZIP.get(stage, ())):
            rel, data = rel + ".gz", gzip.compress(data, mtime=0)       # no timestamp: the same rows, the same bytes
        target = dest / rel
        if not target.exists() or (target.read_bytes() != data and not same_result(target, data)):
            write_bytes(target, data)                                     # a result moved (times move with it)
        written[rel] = target
    for rel in publish_figure_images(profile, stage, ARTIFACTS_ROOT / profile / stage, dest):
        written[rel] = dest / rel                 # the dataset images its figures show: they redraw from results alone
    if dest.exists():
        for old in [x for x in dest.rglob("*") if x.is_file()]:
            if old.relative_to(dest).as_posix() not in written:
                old.unlink()
    return sorted(written)


def publish_run(profile: str, partial: bool = False, published: Sequence[str] | None = None,
                measured: dict[str, dict[str, Any]] | None = None) -> None:
    """After a run: the answers its stages used (results/<profile>/cache/), the stage timings and the
    machine (results/<profile>/timings.json), the digests of the saved notebooks' code and outputs
    (results/<profile>/notebooks.json: the notebooks that go with these results); then the size check.
    `partial`: the run covered some stages only (e.g. `make reproduce NB=02` on a fresh clone): the committed
    answers stay beside the ones it used (it has not used the other stages' answers and must not drop them); a
    run of every stage writes exactly what it used. `measured`: stage -> {"section", "row"}, the times this run
    measured and what kind each is ("stages": from nothing, "replayed": a fresh clone's, None: neither, which is
    never published); only those of the `published` stages are written, so an old cold time a later warm rerun
    found in artifacts/ is never published as its own, and a rerun that measured nothing leaves timings.json as
    it was (the latest run's times stay in artifacts/<profile>/timings.json)."""
    cache = default_cache_path(profile)
    if cache.exists():
        n = ResponseCache(cache).export(cache_export_path(profile), keep=partial)
        print(f">> {n} model answers the stages used -> {cache_export_path(profile).relative_to(ROOT)}")
    if measured:                             # only the times this run measured of the kind each row records
        old = read_json(timings_path(profile)) if timings_path(profile).exists() else {}
        stages_ = dict(old.get("stages", {}))
        replayed = dict(old.get("replayed", {}))
        for k, m in measured.items():
            if published is not None and k not in published:
                continue
            if m.get("section") == "stages":
                stages_[k] = m["row"]                  # from nothing: every model trained and asked in this run
            elif m.get("section") == "replayed":
                replayed[k] = m["row"]                 # a fresh clone's: trained here, committed answers replayed
        new = {"machine": machine_description() if (stages_ != old.get("stages", {}) or replayed != old.get("replayed", {}))
               else old.get("machine", machine_description()), "stages": stages_, **({"replayed": replayed} if replayed else {})}
        if new != {k: v for k, v in old.items() if k != "last_run"} or "last_run" in old:
            write_json(timings_path(profile), new)
    write_json(results_dir(profile) / "notebooks.json", notebook_digests(profile))
    size = sum(f.stat().st_size for f in results_dir(profile).rglob("*") if f.is_file()) / 2 ** 20
    note = "" if size <= SIZE_CAP_MB else f" (over the {SIZE_CAP_MB} MB cap: commit fewer per-item files)"
    print(f">> results/{profile}/: {size:.1f} MB{note}")


def notebook_digests(profile: str) -> dict[str, str]:
    """sha256 of each saved notebook's code cells and their outputs (not its markdown: a reading may be
    edited after the run without running it again). Embedded notebooks are saved in place."""
    import nbformat
    out = {}
    for st in stages():
        if st.notebook is None:
            continue
        nb_path = st.notebook if profile == "embedded" else ARTIFACTS_ROOT / profile / "notebooks" / st.notebook.name
        if not nb_path.exists():
            continue
        nb = nbformat.read(str(nb_path), as_version=4)
        blob = json.dumps([(c.source, c.get("outputs", [])) for c in nb.cells if c.cell_type == "code"],
                          sort_keys=True, ensure_ascii=True)
        out[st.notebook.name] = hashlib.sha256(blob.encode()).hexdigest()
    return out


# ----------------------------------------------------------------------------- comparing a run with the committed results



def seed_spread(profile: str, stage: str, root: Path | None = None) -> dict[str, tuple[float, float]]:
    """Metric -> (low, high) of its committed seed spread, where the stage has seed replicates: notebook
    02's trace_seeds_<variant>_<column>_mean keys against that column's range over the seeds in seeds.csv
    (widened by 2 sd), notebook 05's <variant>_seed_mean against its seeds' min and max."""
    import pandas as pd
    d = (root or results_dir(profile)) / stage
    out: dict[str, tuple[float, float]] = {}
    if stage == "02_finetuning" and (d / "seeds.csv").exists():
        tab = pd.read_csv(d / "seeds.csv")
        for v, g in tab.groupby("variant", sort=False):
            for col in ("accuracy", "auroc", "macro_f1", "acc_type_001", "unseen_accuracy"):
                if col in g and g[col].notna().any():
                    sd = float(g[col].std()) if len(g) > 1 else 0.0
                    out[f"trace_seeds_{v.replace('+', '_')}_{col}_mean"] = (float(g[col].min()) - 2 * sd,
                                                                            float(g[col].max()) + 2 * sd)
    if (d / "metrics.json").exists():
        m = read_json(d / "metrics.json")
        for k in m:
            if k.endswith("_seed_mean"):
                v = k[:-len("_seed_mean")]
                if f"{v}_seed_min" in m:
                    out[k] = (float(m[f"{v}_seed_min"]), float(m[f"{v}_seed_max"]))
    return out


def compare_metrics(committed: dict, new: dict, spread: dict[str, tuple[float, float]] | None = None) -> list[str]:
    """How a run's metrics compare with the committed ones: "identical", or one line per metric that
    differs, saying whether it falls inside its committed seed spread (or has none to judge by).
    Timings, rates and call counts are not compared (they measure the machine)."""
    spread = spread or {}
    diff, timing = [], 0
    for k in sorted(set(committed) | set(new)):
        if TIMING.search(k):
            timing += 1
            continue
        a, b = committed.get(k), new.get(k)
        num = isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool)
        same = a == b or (num and (abs(float(a) - float(b)) <= 1e-6 * max(1.0, abs(float(a)))
                                   or (math.isnan(float(a)) and math.isnan(float(b)))))   # undefined in both
        if same:
            continue
        if a is None or b is None:
            diff.append(f"{k}: {'new' if a is None else 'no longer written'} ({a!r} -> {b!r})")
        elif k in spread and isinstance(b, (int, float)):
            lo, hi = spread[k]
            where = "inside" if lo <= float(b) <= hi else "OUTSIDE"
            diff.append(f"{k}: {a!r} -> {b!r}, {where} the committed seed spread [{lo:.4g}, {hi:.4g}]")
        else:
            diff.append(f"{k}: {a!r} -> {b!r} (differs; no seed spread to judge it by)")
    head = "identical to the committed results" if not diff else f"{len(diff)} metrics differ from the committed results"
    return [f"{head} ({timing} timings and counts not compared)"] + diff


def collect(profile: str) -> list[tuple[str, str, object]]:
    """(stage, metric, value) of every committed metrics.json of the profile, in stage order."""
    rows = []
    for st in stages():
        mfile = results_dir(profile) / st.name / "metrics.json"
        if mfile.exists():
            rows += [(st.name, k, v) for k, v in read_json(mfile).items()]
    return rows


#: the results are organised by system: stage -> the system (or shared part) it belongs to
SYSTEM_OF_STAGE = {"00_data_prep": "Data (MemeWorld)", "models": "Embedded models", "serving": "Served LLM",
                   "01_captioning": "TRACE", "02_finetuning": "TRACE", "03_clip4dm": "CLIP4DM",
                   "04_few_shot": "See, Explain, Intervene", "05_debate": "ARCADE on H-VLI",
                   "06_evaluation": "All four systems on the same memes"}
SYSTEM_ORDER = ["All four systems on the same memes", "TRACE", "CLIP4DM", "See, Explain, Intervene", "ARCADE on H-VLI",
                "Data (MemeWorld)", "Embedded models", "Served LLM"]


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def comparison_tables(profile: str) -> list[str]:
    """Notebook 06's cross-method table (accuracy with its 95% CI on the common memes, each
    method's own memes beside it) and the prompt-injection table, from its committed CSVs."""
    d = results_dir(profile) / "06_evaluation"
    out = []
    comp, inj = d / "comparison.csv", d / "injection.csv"
    if comp.exists():
        rows = list(csv.DictReader(comp.open(encoding="utf-8")))

        def cell(method, memes, metric):
            r = next((r for r in rows if r["method"] == method and r["memes"] == memes and r["subset"] == "all"
                      and r["metric"] == metric), None)
            return "—" if r is None else f"{float(r['value']):.3f} [{float(r['ci_low']):.3f}, {float(r['ci_high']):.3f}]"
        methods = list(dict.fromkeys((r["system"], r["method"]) for r in rows if r["memes"] == "common"))
        n_common = next((r["n"] for r in rows if r["memes"] == "common" and r["subset"] == "all"), "?")
        out.append(f"*Every method on the same {n_common} memes (accuracy, macro-F1 and AUROC with 95% bootstrap CIs; "
                   f"the method's own test memes beside them; notebook 06):*\n")
        out.append("| system | method | accuracy (common) | macro-F1 (common) | AUROC (common) | accuracy (own memes, n) |")
        out.append("|---|---|---|---|---|---|")
        for system, method in methods:
            own = next((r for r in rows if r["method"] == method and r["memes"] == "own" and r["subset"] == "all"
                        and r["metric"] == "accuracy"), None)
            own_s = "—" if own is None else f"{float(own['value']):.3f} ({own['n']})"
            out.append(f"| {system} | {method} | {cell(method, 'common', 'accuracy')} | {cell(method, 'common', 'macro_f1')} "
                       f"| {cell(method, 'common', 'auroc')} | {own_s} |")
        out.append("")
    if inj.exists():
        rows = list(csv.DictReader(inj.open(encoding="utf-8")))
        out.append("*Prompt injection: share of the memes a method called hateful that it calls non-hateful once an "
                   "instruction (or the neutral control sentence) is added; notebook 06:*\n")
        out.append("| method | copies | mitigation | flip rate [95% CI] | called hateful before |")
        out.append("|---|---|---|---|---|")
        for r in rows:
            fr = "—" if r["flip_rate"] in ("", "nan") else \
                f"{float(r['flip_rate']):.3f} [{float(r['ci_low']):.3f}, {float(r['ci_high']):.3f}]" \
                if r["ci_low"] not in ("", "nan") else f"{float(r['flip_rate']):.3f}"
            out.append(f"| {r['method']} | {r['copies']} | {r['mitigation']} | {fr} | {r['n_called_hateful']} of {r['n_pairs']} |")
        out.append("")
    return out


#: the profiles whose results the README and docs show (a smoke or ci run's numbers never appear there)
README_PROFILES: tuple[str, ...] = ("embedded", "paper")


def render(profiles: tuple[str, ...] = README_PROFILES) -> str:
    """Every committed metric, per profile and within it per system (notebook 06's cross-method and
    injection tables first): docs/results.md."""
    parts = []
    for prof in profiles:
        rows = collect(prof)
        if not rows:
            continue
        t = read_json(timings_path(prof)) if timings_path(prof).exists() else {}
        parts.append(f"## Profile `{prof}`\n\nProduced by `make reproduce PROFILE={prof}` on: "
                     f"{t.get('machine', 'an unrecorded machine')}; committed under `results/{prof}/`.\n")
        by_system: dict[str, list] = {}
        for stage, k, v in rows:
            by_system.setdefault(SYSTEM_OF_STAGE.get(stage, "Other stages"), []).append((stage, k, v))
        order = SYSTEM_ORDER + sorted(set(by_system) - set(SYSTEM_ORDER))
        for system in order:
            if system not in by_system:
                continue
            parts.append(f"### {system} (`{prof}`)\n")
            if system == SYSTEM_ORDER[0]:
                parts += comparison_tables(prof)
            parts.append(f"<details><summary>every metric ({len(by_system[system])})</summary>\n")
            parts.append("| stage | metric | value |\n|---|---|---|")
            for stage, k, v in by_system[system]:
                parts.append(f"| {stage} | `{k}` | {_fmt(v)} |")
            parts.append("\n</details>\n")
    if not parts:
        return "_No committed results yet: run `make reproduce`._\n"
    return "\n".join(parts)


def _minutes(s: float) -> str:
    return f"{s / 60:.1f} min" if s >= 60 else f"{s:.0f} s"


def fresh_clone_times(timings: dict[str, Any], names: Sequence[str]) -> dict[str, float | None]:
    """A fresh clone's time per stage of `names` (None: not measured): its time with the committed model answers
    replayed (timings.json's `replayed`) where it has one, else its time from nothing (a stage that asks no model
    runs the same either way); {} where no stage was timed replayed (the fresh-clone row is not measured yet)."""
    st, replayed = timings.get("stages", {}), timings.get("replayed", {})
    return {n: (replayed.get(n) or st.get(n) or {}).get("wall_s") for n in names} if replayed else {}


def earlier_parameters(timings: dict[str, Any], profile: str, section: str, stage: str) -> bool:
    """Whether timings.json's row `section` (stages / replayed / last_run) of `stage` was measured at parameters
    that have changed since (its `params` digest differs from the profile's section now). A row without a
    digest (recorded before timings kept one) counts as current: nothing says otherwise."""
    row = timings.get(section, {}).get(stage) or {}
    if "params" not in row:
        return False
    try:
        now = section_digest(load_profile(profile).get(stage))
    except ProfileError:                     # an unreadable profile: nothing to compare against
        return False
    return row["params"] != now


EARLIER = "†"


def _earlier_note(profile: str) -> str:
    return (f"{EARLIER} measured at that stage's earlier parameters (`params/{profile}.yaml` has changed since): its "
            f"time at the current ones may differ.")


def timings_block(profile: str = "embedded") -> str:
    """`make reproduce`'s measured time per stage (results/<profile>/timings.json) and `make test`'s
    (results/make_test.json), each with the machine that measured it."""
    out = []
    if timings_path(profile).exists():
        t = read_json(timings_path(profile))
        st = t.get("stages", {})
        total = sum(v["wall_s"] for v in st.values())
        replayed = t.get("replayed", {})
        names = [s.name for s in stages()]
        unmeasured = [n for n in names if n not in st]
        fresh = fresh_clone_times(t, names)
        fresh_total = sum(v for v in fresh.values() if v is not None)

        def mark(section: str, n: str) -> str:
            return EARLIER if earlier_parameters(t, profile, section, n) else ""
        fresh_mark = {n: mark("replayed" if n in replayed else "stages", n) for n in names}
        older = [n for n in names if fresh_mark[n]]
        out.append(f"`make reproduce` (profile `{profile}`) from nothing, every model trained and asked afresh, on "
                   f"{t.get('machine', '?')}: {_minutes(total)} in all"
                   + (f" for the stages measured so ({', '.join(unmeasured)} not yet: their model answers were asked "
                      f"over several runs)" if unmeasured else "")
                   + f", against a budget of {BUDGET_S // 3600} hours"
                   + (f"; a fresh clone's `make reproduce`, every model trained and run here with the committed model "
                      f"answers replayed: {_minutes(fresh_total)}"
                      + (f" for the stages measured so ({', '.join(n for n in names if fresh[n] is None)} not yet)"
                         if any(v is None for v in fresh.values()) else
                         f", every stage measured: {'inside' if fresh_total <= BUDGET_S else 'over'} the budget"
                         + (f" ({', '.join(older)} timed at {'its' if len(older) == 1 else 'their'} earlier parameters"
                            f"{EARLIER})" if older else ""))
                      if replayed else "")
                   + ".\n")
        out.append("| | " + " | ".join(names) + " |")
        out.append("|---|" + "---|" * len(names))
        out.append("| from nothing | " + " | ".join(_minutes(st[n]["wall_s"]) + mark("stages", n) if n in st
                                                  else "not measured" for n in names) + " |")
        marked = any(mark("stages", n) for n in names if n in st)
        if fresh:
            out.append("| fresh clone (trained here, committed answers replayed) | "
                       + " | ".join(_minutes(fresh[n]) + fresh_mark[n] if fresh[n] is not None else "—" for n in names)
                       + " |")
            marked = marked or bool(older)
        out.append("")
        if marked:
            out.append(_earlier_note(profile) + "\n")
    mt = RESULTS_ROOT / "make_test.json"
    if mt.exists():
        t = read_json(mt)
        steps = "; ".join(f"{k} {_minutes(v)}" for k, v in t["steps"].items())
        lanes = t.get("side_by_side", [])
        beside = f"; side by side: {' | '.join(lanes)}" if lanes else ""
        out.append(f"`make test` from a fresh clone on {t['machine']}: {_minutes(t['total_s'])} "
                   f"({_minutes(t['venv_s'])} of it creating `.venv`; "
                   f"{_minutes(t['total_s'] - t['venv_s'])} with `.venv` present), {t['passed']} checks passed "
                   f"(commit {t['commit']}): {steps}{beside}.")
    return "\n".join(out) if out else "_Not measured yet._"


def costs_block(profile: str = "paper") -> str:
    """docs/gpu-costs.md's table: `python -m lib.compendium.costs` for the paper profile on one H100 80GB."""
    a = Assumptions()
    rows = cost_rows(profile, a)
    return (f"Profile `{profile}`, memes of {a.image_size[0]} x {a.image_size[1]} px, one {a.gpu}:\n\n"
            + markdown(rows, a) + f"\n\nTotal: about {sum(r.gpu_hours for r in rows):.0f} GPU-hours ("
            + ("the measured rows from committed GPU records, the rest estimated" if any(r.kind.startswith("measured") for r in rows)
               else "estimated") + ").")


def serving_block(profile: str = "embedded") -> str:
    """docs/models-and-serving.md's measurements: the serving stage's committed metrics."""
    f = results_dir(profile) / "serving" / "metrics.json"
    if not f.exists():
        return "_Not measured yet: `make reproduce NB=serving`._"
    m = read_json(f)
    t = read_json(timings_path(profile)).get("machine", "?") if timings_path(profile).exists() else "?"
    from lib.models.serving import metrics_markdown  # lazy: the serving stage pulls in the chat backends
    return metrics_markdown(m, t)


def notebook_cost(stage: str, profile: str = "embedded") -> str:
    """A notebook header's cost cell: the stage's measured time from nothing and from a fresh clone
    (results/<profile>/timings.json), and the paper profile's estimate on one GPU (lib.compendium.costs)."""
    parts = []
    if timings_path(profile).exists():
        t = read_json(timings_path(profile))
        cold = t.get("stages", {}).get(stage)
        fresh = t.get("replayed", {}).get(stage)
        cores = re.search(r"(\d+) CPU cores", t.get("machine", ""))
        where = f"{cores.group(1)} CPU cores" if cores else "this machine"

        def then(section: str) -> str:
            return " at this stage's earlier parameters" if earlier_parameters(t, profile, section, stage) else ""
        clone = (f", {_minutes(fresh['wall_s'])} from a fresh clone (its models trained here, the committed answers "
                 f"replayed{then('replayed')})" if fresh else "")
        if cold:
            parts.append(f"embedded: {_minutes(cold['wall_s'])} on {where} from nothing (`make reproduce`"
                         f"{then('stages')})" + clone)
        elif fresh:
            parts.append(f"embedded: not yet timed from nothing on {where} (its model answers were asked over "
                         f"several runs)" + clone)
    rows = [r for r in cost_rows("paper", Assumptions()) if r.stage[:2] == stage[:2]]
    if rows:
        hours, gib = sum(r.gpu_hours for r in rows), max(r.gpu_gib for r in rows)
        kinds = sorted({r.kind for r in rows} - {"none"})
        parts.append("paper: " + ("no GPU" if hours == 0 and gib == 0 else
                                  f"about {hours:.1f} GPU-hours and {gib:.0f} GiB on one {Assumptions().gpu} "
                                  f"({', '.join(kinds)}; `python -m lib.compendium.costs`)"))
    return "; ".join(parts) or "not measured yet"


def update_notebook_headers(profile: str = "embedded") -> bool:
    """Fill the `cost` block of each notebook's opening cell (markdown only: the saved outputs stay the run's)."""
    import nbformat
    changed = False
    for st in stages():
        if st.notebook is None:
            continue
        nb = nbformat.read(str(st.notebook), as_version=4)
        cell = nb.cells[0]
        new = _replace_block(cell.source, "cost", notebook_cost(st.name, profile)).replace("\n<!-- cost:end -->",
                                                                                        " <!-- cost:end -->")
        new = new.replace("<!-- cost:start -->\n", "<!-- cost:start --> ")
        if new != cell.source:
            cell.source = new
            write_text(st.notebook, nbformat.writes(nb) + "\n")
            changed = True
    return changed


#: generated blocks: file -> marker name -> function of the profile (`make results` fills them; the
#: readings check skips them, tests/test_results.py checks them against their generators)
BLOCKS = {ROOT / "README.md": {"findings": findings_block, "timings": timings_block,
                                "preconditions": lambda p: precondition_block(results_dir(p))},
          ROOT / "docs" / "gpu-costs.md": {"costs": lambda _: costs_block("paper")},
          ROOT / "docs" / "models-and-serving.md": {"serving": serving_block}}
DOCS_RESULTS = ROOT / "docs" / "results.md"
#: generated pages beside docs/results.md: the findings table and the analysis plan with its history
DOCS_PAGES = {ROOT / "docs" / "findings.md": lambda: findings_page("embedded"),
              ROOT / "docs" / "analysis-plan.md": lambda: plan_page()}


def _replace_block(text: str, name: str, body: str) -> str:
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    if start not in text or end not in text:
        return text
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body.strip()}\n{end}{tail}"


def results_page() -> str:
    return ("# Results: every committed metric\n\n"
            "Generated by `make results` from `results/<profile>/` (what `make reproduce` commits); do not edit by "
            "hand. The findings and their tests are in the README; each notebook's reading explains its numbers.\n\n"
            + render())


def update_readme(readme: Path | None = None) -> bool:
    """Regenerate every generated block (the README's findings and timings, docs/gpu-costs.md's table) and
    docs/results.md from the committed results; returns whether anything changed."""
    changed = False
    for path, blocks in BLOCKS.items():
        path = readme if readme is not None and path.name == "README.md" else path
        text = path.read_text(encoding="utf-8") if path.exists() else ""
        new = text
        for name, fn in blocks.items():
            new = _replace_block(new, name, fn("embedded"))
        if new != text:
            write_text(path, new)
            changed = True
    page = results_page()
    if not DOCS_RESULTS.exists() or DOCS_RESULTS.read_text(encoding="utf-8") != page:
        write_text(DOCS_RESULTS, page)
        changed = True
    for path, make in DOCS_PAGES.items():
        text = make()
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            write_text(path, text)
            changed = True
    return update_notebook_headers() or changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Regenerate the README's findings and timings and docs/results.md "
                                             "from results/ (make results)")
    ap.add_argument("--readme", default=str(ROOT / "README.md"))
    args = ap.parse_args(argv)
    changed = update_readme(Path(args.readme))
    print(json.dumps({"updated": changed}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
