"""The README's results table, generated from `artifacts/<profile>/<stage>/metrics.json`.

Each row is one headline number, with the stage and profile it came from and the
machine that produced it (recorded in `artifacts/<profile>/machine.json` by the run).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import re
from pathlib import Path

from lib import ROOT
from lib.artifacts import ARTIFACTS_ROOT, read_json, write_json, write_text

START = "<!-- results:start -->"
END = "<!-- results:end -->"


def machine_description() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        import torch
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    except Exception:  # torch missing or broken: the table still renders
        gpu = "unknown accelerator"
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores ({cpu}), {gpu}"


def record_machine(profile: str) -> None:
    write_json(ARTIFACTS_ROOT / profile / "machine.json", {"machine": machine_description()})


def collect(profile: str) -> list[tuple[str, str, object]]:
    rows = []
    base = ARTIFACTS_ROOT / profile
    if not base.exists():
        return rows
    for mfile in sorted(base.glob("*/metrics.json")):
        stage = mfile.parent.name
        for k, v in read_json(mfile).items():
            rows.append((stage, k, v))
    return rows


def existing_rows(block: str) -> dict[str, list[tuple[str, str, str]]]:
    """Rows already in the README's results block, per profile: (stage, metric, value as shown)."""
    out: dict[str, list[tuple[str, str, str]]] = {}
    prof = None
    for line in block.splitlines():
        m = re.match(r"\*\*Profile `([^`]+)`\*\*", line)
        if m:
            prof = m.group(1)
            continue
        m = re.match(r"\| (\S+) \| `([^`]+)` \| (.*) \|$", line)
        if prof and m and m.group(1) != "stage":
            out.setdefault(prof, []).append((m.group(1), m.group(2), m.group(3)))
    return out


#: the README's results are organised by system: stage -> the system (or shared part) it belongs to
SYSTEM_OF_STAGE = {"00_data_prep": "Data (MemeWorld)", "models": "Embedded models", "serving": "Served LLM",
                   "01_captioning": "TRACE", "02_finetuning": "TRACE", "03_clip4dm": "CLIP4DM",
                   "04_few_shot": "See, Explain, Intervene", "05_debate": "ARCADE on H-VLI",
                   "06_evaluation": "All four systems on the same memes"}
SYSTEM_ORDER = ["All four systems on the same memes", "TRACE", "CLIP4DM", "See, Explain, Intervene", "ARCADE on H-VLI",
                "Data (MemeWorld)", "Embedded models", "Served LLM"]


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)      # kept rows are already strings


def comparison_tables(profile: str) -> list[str]:
    """Notebook 06's cross-method table (accuracy with its 95% CI on the common memes, each
    method's own memes beside it) and the prompt-injection table, from its CSVs."""
    d = ARTIFACTS_ROOT / profile / "06_evaluation"
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


#: the profiles whose results the README shows (paper-smoke's numbers mean nothing and never appear there)
README_PROFILES: tuple[str, ...] = ("embedded", "paper")


def render(profiles: tuple[str, ...] = README_PROFILES, keep: dict[str, list] | None = None) -> str:
    """The results block, per profile and within it per system: notebook 06's cross-method and
    injection tables first, then every stage's metrics under the system it belongs to. A stage
    with no metrics.json here keeps the rows it has in `keep` (the block being replaced), so
    running one stage does not drop the others' results."""
    parts = []
    for prof in profiles:
        rows = collect(prof)
        here = {stage for stage, _, _ in rows}
        kept = [(st, k, v) for st, k, v in (keep or {}).get(prof, []) if st not in here]
        rows = sorted(rows + kept, key=lambda r: r[0])     # stable: metric order kept within a stage
        if not rows:
            continue
        mfile = ARTIFACTS_ROOT / prof / "machine.json"
        machine = read_json(mfile)["machine"] if mfile.exists() else "unrecorded machine"
        parts.append(f"**Profile `{prof}`**, produced by `make reproduce PROFILE={prof}` on: {machine}.\n")
        by_system: dict[str, list] = {}
        for stage, k, v in rows:
            by_system.setdefault(SYSTEM_OF_STAGE.get(stage, "Other stages"), []).append((stage, k, v))
        order = SYSTEM_ORDER + sorted(set(by_system) - set(SYSTEM_ORDER))
        for system in order:
            if system not in by_system and not (system == SYSTEM_ORDER[0] and comparison_tables(prof)):
                continue
            parts.append(f"#### {system} (`{prof}`)\n")
            if system == SYSTEM_ORDER[0]:
                parts += comparison_tables(prof)
            if system in by_system:
                n = len(by_system[system])
                parts.append(f"<details><summary>every metric ({n})</summary>\n")
                parts.append("| stage | metric | value |\n|---|---|---|")
                for stage, k, v in by_system[system]:
                    parts.append(f"| {stage} | `{k}` | {_fmt(v)} |")
                parts.append("\n</details>\n")
    if not parts:
        return "_No metrics yet: run `make reproduce`._\n"
    return "\n".join(parts)


def update_readme(readme: Path) -> bool:
    """Replace the block between the results markers; returns whether it changed."""
    record_machine_if_missing()
    text = readme.read_text(encoding="utf-8") if readme.exists() else ""
    if START not in text or END not in text:
        return False
    head, rest = text.split(START, 1)
    old, tail = rest.split(END, 1)
    new = f"{head}{START}\n{render(keep=existing_rows(old))}\n{END}{tail}"
    if new != text:
        write_text(readme, new)
        return True
    return False


def record_machine_if_missing() -> None:
    for prof_dir in ARTIFACTS_ROOT.glob("*"):
        if prof_dir.is_dir() and not (prof_dir / "machine.json").exists() and any(prof_dir.glob("*/metrics.json")):
            record_machine(prof_dir.name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--readme", default=str(ROOT / "README.md"))
    args = ap.parse_args(argv)
    changed = update_readme(Path(args.readme))
    print(json.dumps({"readme_updated": changed}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
