"""Did a change move a result? Compare two runs of one profile (two `artifacts/<profile>/` folders, e.g.
the same profile run at two commits on one machine, the second replaying the first's model answers):

    python -m lib.compendium.compare RUN_A RUN_B [--out report.json]

Each stage's `metrics.json` is compared metric by metric (timings, rates and call counts aside: they
measure the machine; `results.compare_metrics`), then every other JSON, JSON-lines and CSV result
file after the parts that say where and when a run happened are set aside: absolute paths (each run's
folder is replaced by one placeholder), timing fields, cache bookkeeping (`from_cache`, hits, calls
made) and the digests of the code that built a cached artifact. What remains differs only if a
result did. Only the stages both runs hold are compared (the others are listed); against committed results
(results/<profile>/, e.g. a child profile's run against the embedded results) only what a run publishes is. Exit status 0 when every metric and file
agrees, 1 when something differs, 2 on bad input or when nothing could be compared (no stage results in a
folder, no stage in common, no metric or file in common): a comparison of nothing never passes.
"""
from __future__ import annotations

import argparse
import csv
import fnmatch
import gzip
import io
import json
import math
import os
import sys
import zlib
from pathlib import Path
from typing import Any

from lib.compendium.artifacts import RESULTS_ROOT, cli_error, write_json
from lib.compendium.params import stages
from lib.compendium.bookkeeping import BOOKKEEPING, bookkeeping  # noqa: F401  (compare.BOOKKEEPING as before)
from lib.compendium.results import RESULT_FILES, compare_metrics

SKIP_FILES = frozenset({".stamp.json", "timings.json", "manifest.json", ".from_results.json"})
SKIP_DIRS = frozenset({"cache", "notebooks", "figures", "report", "test-logs", "lab"})


def _bookkeeping(key: str, value: Any) -> bool:
    return bookkeeping(key, value)


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


class CompareError(ValueError):
    """The two folders cannot be compared: the message names the folder or file and what is wrong."""


def _parse_json(path: Path, text: str, line: int | None = None) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        at = f"line {line}" if line is not None else f"line {e.lineno} column {e.colno}"
        raise CompareError(f"{path}: malformed JSON at {at}: {e.msg}") from None


def _text(path: Path) -> str:
    try:
        if path.suffix == ".gz":
            try:
                return gzip.decompress(path.read_bytes()).decode("utf-8")
            except (EOFError, OSError, zlib.error) as e:
                raise CompareError(f"{path}: the gzip stream is damaged ({type(e).__name__}: {e})") from None
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise CompareError(f"{path}: byte {e.start} is not UTF-8 ({e.reason})") from None
    except OSError as e:
        raise CompareError(f"{path}: cannot be read ({e.strerror or e})") from None


def _read(path: Path, roots: tuple[str, ...]) -> Any:
    kind = Path(path.name.removesuffix(".gz")).suffix
    if kind == ".json":
        return normalise(_parse_json(path, _text(path)), roots)
    if kind == ".jsonl":
        return [normalise(_parse_json(path, line, n), roots)
                for n, line in enumerate(_text(path).splitlines(), 1) if line.strip()]
    try:
        rows = list(csv.reader(io.StringIO(_text(path), newline="")))
    except csv.Error as e:
        raise CompareError(f"{path}: malformed CSV ({e})") from None
    if not rows:
        return []
    keep = [i for i, c in enumerate(rows[0]) if not _bookkeeping(c, None)]
    return [[normalise(r[i], roots) if i < len(r) else None for i in keep] for r in rows]


def _metrics(path: Path) -> dict[str, Any]:
    m = _parse_json(path, _text(path))
    if not isinstance(m, dict):
        raise CompareError(f"{path}: a JSON {type(m).__name__}, expected an object of metric -> value")
    return m


RESULT_SUFFIXES = (".json", ".jsonl", ".csv")


def is_published(root: Path) -> bool:
    """Whether a folder is a profile's committed results (results/<profile>/, or a copy of it: it keeps the
    saved notebooks' digests) rather than a run's working folder (artifacts/<profile>/)."""
    try:
        root.resolve().relative_to(RESULTS_ROOT.resolve())
        return True
    except ValueError:
        return (root / "notebooks.json").is_file()


def _result_files(root: Path, published_only: bool = False) -> dict[str, Path]:
    """The result files of a run folder: name relative to it -> path. JSON, JSON-lines and CSV inside a stage's
    folder (committed ones may be gzipped: `x.csv.gz` is named `x.csv`), without what says how the run went
    (stamps, timings, manifests), the caches and saved notebooks. `published_only`: only what a run publishes
    (results.RESULT_FILES), for a comparison with committed results, which hold nothing else."""
    out: dict[str, Path] = {}
    for p in root.rglob("*"):
        rel = p.relative_to(root)
        name = rel.as_posix().removesuffix(".gz")
        if (not p.is_file() or not name.endswith(RESULT_SUFFIXES) or p.name in SKIP_FILES or len(rel.parts) < 2
                or SKIP_DIRS & set(rel.parts) or any(part.startswith(".") for part in rel.parts)):
            continue
        stage, inside = rel.parts[0], name.split("/", 1)[1]
        if published_only and not any(fnmatch.fnmatch(inside, pat) for pat in RESULT_FILES.get(stage, ())):
            continue
        out[name] = p
    return out


def run_stages(root: Path, published_only: bool = False) -> dict[str, dict[str, Path]]:
    """stage folder -> its result files (name relative to the run folder -> path), for the stages that wrote any."""
    out: dict[str, dict[str, Path]] = {}
    for rel, p in _result_files(root, published_only).items():
        out.setdefault(rel.split("/", 1)[0], {})[rel] = p
    return out


def _stage_order(name: str) -> tuple[int, str]:
    names = [s.name for s in stages()]
    return (names.index(name) if name in names else len(names), name)


def compare_runs(a: Path, b: Path) -> dict[str, Any]:
    """{"metrics": stage -> {"n", "identical", "differ": [lines]}, "files": {"compared", "identical",
    "differ": [paths], "only_in_a", "only_in_b"}, "stages": {"compared", "only_in_a", "only_in_b"},
    "identical": bool} for two run folders, on the stages both ran: a stage only one run has is listed, not
    counted as a difference (a child profile that ran one stage compares on that stage). Raises CompareError
    when there is nothing to compare (a folder with no stage results, no stage in common, nothing compared)
    and for a malformed file (named with the parser's reason): a comparison that compared nothing never passes."""
    for p, which in ((a, "RUN_A"), (b, "RUN_B")):
        if not p.is_dir():
            raise CompareError(f"{p}: not a run folder ({which}: artifacts/<profile>/ or results/<profile>/)")
    published_only = is_published(a) or is_published(b)
    sa, sb = run_stages(a, published_only), run_stages(b, published_only)
    for p, st, which in ((a, sa, "RUN_A"), (b, sb, "RUN_B")):
        if not st:
            raise CompareError(f"{p} ({which}) holds no stage results (no stage folder with a .json, .jsonl or .csv "
                               f"result): nothing to compare; is it a run's folder (artifacts/<profile>/)?")
    common = sorted(set(sa) & set(sb), key=_stage_order)
    if not common:
        raise CompareError(f"the runs have no stage in common ({a}: {', '.join(sorted(sa))}; {b}: "
                           f"{', '.join(sorted(sb))}): nothing to compare")
    roots = tuple(sorted({str(a.resolve()), str(a), str(b.resolve()), str(b)}, key=len, reverse=True))
    metrics: dict[str, Any] = {}
    for st in common:
        fa, fb = a / st / "metrics.json", b / st / "metrics.json"
        if not (fa.exists() or fb.exists()):
            continue
        if not (fa.exists() and fb.exists()):
            metrics[st] = {"n": 0, "identical": False, "differ": [f"metrics.json only in {'a' if fa.exists() else 'b'}"]}
            continue
        ma, mb = _metrics(fa), _metrics(fb)
        lines = compare_metrics(ma, mb)
        metrics[st] = {"n": len(set(ma) | set(mb)), "identical": len(lines) == 1,
                       "summary": lines[0].replace("the committed results", "the first run"),
                       "differ": lines[1:]}
    pa = {rel: p for st in common for rel, p in sa[st].items() if rel != f"{st}/metrics.json"}
    pb = {rel: p for st in common for rel, p in sb[st].items() if rel != f"{st}/metrics.json"}
    fa_, fb_ = set(pa), set(pb)
    differ = [rel for rel in sorted(fa_ & fb_) if _read(pa[rel], roots) != _read(pb[rel], roots)]
    compared = len(fa_ & fb_) + sum(m["n"] for m in metrics.values())
    if not compared:
        raise CompareError(f"the stages both runs have ({', '.join(common)}) hold no metric and no result file in "
                           f"common: nothing was compared")
    report = {"a": str(a), "b": str(b), "published_only": published_only, "metrics": metrics,
              "stages": {"compared": common, "only_in_a": sorted(set(sa) - set(sb), key=_stage_order),
                         "only_in_b": sorted(set(sb) - set(sa), key=_stage_order)},
              "files": {"compared": len(fa_ & fb_), "identical": len(fa_ & fb_) - len(differ), "differ": differ,
                        "only_in_a": sorted(fa_ - fb_), "only_in_b": sorted(fb_ - fa_)}}
    report["identical"] = (all(m["identical"] for m in metrics.values()) and not differ
                           and not report["files"]["only_in_a"] and not report["files"]["only_in_b"])
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", type=Path, help="the first run's folder (artifacts/<profile>/ of one checkout, or results/<profile>/)")
    ap.add_argument("b", type=Path, help="the second run's folder")
    ap.add_argument("--out", type=Path, default=None, help="write the report here as JSON (a file's path)")
    args = ap.parse_args(argv)
    if args.out is not None and (args.out.is_dir() or str(args.out).endswith(("/", os.sep))):
        return cli_error(f"--out {args.out}: a folder; give the path of the JSON file to write")
    try:
        rep = compare_runs(args.a, args.b)
    except CompareError as e:
        return cli_error(str(e))
    st = rep["stages"]
    print(f"stages compared: {', '.join(st['compared'])}"
          + (f"; only in a (not compared): {', '.join(st['only_in_a'])}" if st["only_in_a"] else "")
          + (f"; only in b (not compared): {', '.join(st['only_in_b'])}" if st["only_in_b"] else ""))
    for name, m in rep["metrics"].items():
        print(f"{name}: {m['n']} metrics; " + (m.get("summary") or "; ".join(m["differ"])))
        for line in m["differ"] if "summary" in m else []:
            print("    " + line)
    f = rep["files"]
    print(f"other result files: {f['compared']} compared, {f['identical']} identical once paths, timings and "
          f"cache bookkeeping are set aside; {len(f['differ'])} differ; {len(f['only_in_a'])} only in a, "
          f"{len(f['only_in_b'])} only in b")
    for rel in f["differ"]:
        print("    differs: " + rel)
    for rel in f["only_in_a"]:
        print("    only in a: " + rel)
    for rel in f["only_in_b"]:
        print("    only in b: " + rel)
    if args.out:
        try:
            write_json(args.out, rep)
        except OSError as e:
            return cli_error(f"--out {args.out}: cannot be written ({e.strerror or e})")
    return 0 if rep["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
