"""Did a change move a result? Compare two runs of one profile (two `artifacts/<profile>/` folders, e.g.
the same profile run at two commits on one machine, the second replaying the first's model answers):

    python -m lib.compendium.compare RUN_A RUN_B [--out report.json]

Each stage's `metrics.json` is compared metric by metric (timings, rates and call counts aside: they
measure the machine; `results.compare_metrics`), then every other JSON, JSON-lines and CSV result
file after the parts that say where and when a run happened are set aside: absolute paths (each run's
folder is replaced by one placeholder), timing fields, cache bookkeeping (`from_cache`, hits, calls
made) and the digests of the code that built a cached artifact. What remains differs only if a
result did. Exit status 0 when every metric and file agrees, 1 when something differs, 2 on bad input.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path
from typing import Any

from lib.compendium.artifacts import cli_error, write_json
from lib.compendium.results import TIMING, compare_metrics

#: fields that record how a run went rather than what it found
BOOKKEEPING = frozenset({"from_cache", "cache_hits", "calls_made", "cache_key", "generator_sha256", "key",
                         "created", "finished", "seconds", "render_seconds"})
SKIP_FILES = frozenset({".stamp.json", "timings.json", "manifest.json"})
SKIP_DIRS = frozenset({"cache", "notebooks"})


def _bookkeeping(key: str, value: Any) -> bool:
    return (key in BOOKKEEPING or bool(TIMING.search(key)) or "/s" in key
            or (key == "calls" and isinstance(value, int) and not isinstance(value, bool)))


def normalise(value: Any, roots: tuple[str, ...]) -> Any:
    """A result without where and when it was made: run folders replaced by "<run>", bookkeeping
    fields dropped, NaN made comparable."""
    if isinstance(value, dict):
        return {k: normalise(v, roots) for k, v in value.items() if not _bookkeeping(str(k), v)}
    if isinstance(value, list):
        return [normalise(v, roots) for v in value]
    if isinstance(value, str):
        for r in roots:
            value = value.replace(r, "<run>")
        return value
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return value


def _read(path: Path, roots: tuple[str, ...]) -> Any:
    if path.suffix == ".json":
        return normalise(json.loads(path.read_text(encoding="utf-8")), roots)
    if path.suffix == ".jsonl":
        return [normalise(json.loads(line), roots) for line in path.read_text(encoding="utf-8").splitlines()
                if line.strip()]
    with path.open(encoding="utf-8", newline="") as fh:
        rows = list(csv.reader(fh))
    if not rows:
        return []
    keep = [i for i, c in enumerate(rows[0]) if not _bookkeeping(c, None)]
    return [[normalise(r[i], roots) if i < len(r) else None for i in keep] for r in rows]


def compare_runs(a: Path, b: Path) -> dict[str, Any]:
    """{"metrics": stage -> {"n", "identical", "differ": [lines]}, "files": {"compared", "identical",
    "differ": [paths], "only_in_a", "only_in_b"}, "identical": bool} for two run folders."""
    for p in (a, b):
        if not p.is_dir():
            raise FileNotFoundError(f"{p}: not a run folder (artifacts/<profile>/)")
    roots = tuple(sorted({str(a.resolve()), str(a), str(b.resolve()), str(b)}, key=len, reverse=True))
    stages = sorted({m.parent.name for r in (a, b) for m in r.glob("*/metrics.json")})
    metrics: dict[str, Any] = {}
    for st in stages:
        fa, fb = a / st / "metrics.json", b / st / "metrics.json"
        if not (fa.exists() and fb.exists()):
            metrics[st] = {"n": 0, "identical": False, "differ": [f"metrics.json only in {'a' if fa.exists() else 'b'}"]}
            continue
        ma, mb = json.loads(fa.read_text(encoding="utf-8")), json.loads(fb.read_text(encoding="utf-8"))
        lines = compare_metrics(ma, mb)
        metrics[st] = {"n": len(set(ma) | set(mb)), "identical": len(lines) == 1,
                       "summary": lines[0].replace("the committed results", "the first run"),
                       "differ": lines[1:]}

    def files(root: Path) -> set[str]:
        return {str(p.relative_to(root)) for p in root.rglob("*")
                if p.is_file() and p.suffix in (".json", ".jsonl", ".csv") and p.name not in SKIP_FILES
                and p.name != "metrics.json" and not SKIP_DIRS & set(p.relative_to(root).parts)}
    fa_, fb_ = files(a), files(b)
    differ = [rel for rel in sorted(fa_ & fb_) if _read(a / rel, roots) != _read(b / rel, roots)]
    report = {"a": str(a), "b": str(b), "metrics": metrics,
              "files": {"compared": len(fa_ & fb_), "identical": len(fa_ & fb_) - len(differ), "differ": differ,
                        "only_in_a": sorted(fa_ - fb_), "only_in_b": sorted(fb_ - fa_)}}
    report["identical"] = (all(m["identical"] for m in metrics.values()) and not differ
                           and not report["files"]["only_in_a"] and not report["files"]["only_in_b"])
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", type=Path, help="the first run's folder (artifacts/<profile>/ of one checkout)")
    ap.add_argument("b", type=Path, help="the second run's folder")
    ap.add_argument("--out", type=Path, default=None, help="write the report here as JSON")
    args = ap.parse_args(argv)
    try:
        rep = compare_runs(args.a, args.b)
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError) as e:
        return cli_error(str(e))
    for st, m in rep["metrics"].items():
        print(f"{st}: {m['n']} metrics; " + (m.get("summary") or "; ".join(m["differ"])))
        for line in m["differ"] if "summary" in m else []:
            print("    " + line)
    f = rep["files"]
    print(f"other result files: {f['compared']} compared, {f['identical']} identical once paths, timings and "
          f"cache bookkeeping are set aside; {len(f['differ'])} differ; {len(f['only_in_a'])} only in a, "
          f"{len(f['only_in_b'])} only in b")
    for rel in f["differ"]:
        print("    differs: " + rel)
    if args.out:
        write_json(args.out, rep)
    return 0 if rep["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
