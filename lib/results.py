"""The README's results table, generated from `artifacts/<profile>/<stage>/metrics.json`.

Each row is one headline number, with the stage and profile it came from and the
machine that produced it (recorded in `artifacts/<profile>/machine.json` by the run).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
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
    import re
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


def render(profiles: tuple[str, ...] = ("embedded", "paper"), keep: dict[str, list] | None = None) -> str:
    """The results block. A stage with no metrics.json here keeps the rows it has in `keep` (the
    block being replaced), so running one stage does not drop the others' results."""
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
        parts.append("| stage | metric | value |\n|---|---|---|")
        for stage, k, v in rows:
            val = f"{v:.4g}" if isinstance(v, float) else str(v)   # kept rows are already strings
            parts.append(f"| {stage} | `{k}` | {val} |")
        parts.append("")
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
