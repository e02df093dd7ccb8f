"""Declared artifacts, atomic writes, manifests and metrics files.

Stages (notebooks and python steps) exchange only the files declared in
`ARTIFACTS`, under `artifacts/<profile>/<stage>/`. Every write goes to a temporary
file in the same folder and is then renamed over the target, so a crash never
leaves a half-written artifact. Each stage folder carries `manifest.json`
(params hash, git revision, package versions) next to its outputs.
"""
from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import time
import sys
import tempfile
import threading
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from lib import ROOT
from lib.compendium.codekeys import CODE_ROOT, code_digest, code_of, module_file, source_digest  # noqa: F401  (re-exported)

ARTIFACTS_ROOT = ROOT / "artifacts"
FIGURES_ROOT = ROOT / "figures"
RESULTS_ROOT = ROOT / "results"

#: Profiles whose figures, README tables and committed results are the compendium's own (figures/<profile>/,
#: results/<profile>/). Every other profile (ci, paper-smoke, a user's variant) writes only under
#: artifacts/<profile>/, so running it leaves the working tree as it was.
PUBLISHED_PROFILES: tuple[str, ...] = ("embedded", "paper")


def figures_dir(profile: str, root: Path = ROOT) -> Path:
    """Where a profile's figures go: figures/<profile>/ for a published profile, else
    artifacts/<profile>/figures/ (`root`: the repository root)."""
    return root / "figures" / profile if profile in PUBLISHED_PROFILES else root / "artifacts" / profile / "figures"


def figures_index(profile: str, root: Path = ROOT) -> Path:
    """The figure index notebook 07 writes: figures/README.md for a published profile, else beside its figures."""
    return root / "figures" / "README.md" if profile in PUBLISHED_PROFILES else figures_dir(profile, root) / "README.md"

#: Packages whose versions every manifest records.
TRACKED_PACKAGES = ("torch", "torchvision", "transformers", "open_clip_torch", "peft",
                    "numpy", "pandas", "scikit-learn", "pillow")


@dataclass(frozen=True)
class Artifact:
    """A file or folder one stage writes and later stages read."""
    stage: str        # producing stage, e.g. "00_data_prep"
    relpath: str      # path inside artifacts/<profile>/<stage>/ ({fields} filled by path(): one file per dataset, ...)
    make_target: str  # the command that produces it

    def path(self, profile: str, **fields: str) -> Path:
        return ARTIFACTS_ROOT / profile / self.stage / (self.relpath.format(**fields) if fields else self.relpath)


#: Everything a stage may hand to another stage. Later issues add their entries here.
ARTIFACTS: dict[str, Artifact] = {
    "datasets": Artifact("00_data_prep", "datasets.json", "make reproduce NB=00"),
    "memeworld": Artifact("00_data_prep", "memeworld", "make reproduce NB=00"),
    "trace_captions": Artifact("01_captioning", "trace_captions.json", "make reproduce NB=01"),
    "trace_captions_multioff": Artifact("01_captioning", "trace_captions_multioff.json", "make reproduce NB=01"),
    "trace_seeds": Artifact("02_finetuning", "seeds.csv", "make reproduce NB=02"),
    "trace_runs": Artifact("02_finetuning", "runs", "make reproduce NB=02"),
    "trace_variants": Artifact("02_finetuning", "variants.json", "make reproduce NB=02"),
    "clip4dm_settings": Artifact("03_clip4dm", "settings.json", "make reproduce NB=03"),
    "memeworld-clip": Artifact("models", "memeworld-clip", "make reproduce NB=models"),
    "memeworld-vlm": Artifact("models", "memeworld-vlm", "make reproduce NB=models"),
    "sei_agents": Artifact("04_few_shot", "agents", "make reproduce NB=04"),
    "sei_results": Artifact("04_few_shot", "results.json", "make reproduce NB=04"),
    "sei_predictions": Artifact("04_few_shot", "predictions_{dataset}.jsonl", "make reproduce NB=04"),
    "sei_table3": Artifact("04_few_shot", "table3.json", "make reproduce NB=04"),
    "sei_settings": Artifact("04_few_shot", "settings.json", "make reproduce NB=04"),
    "debate_settings": Artifact("05_debate", "settings.json", "make reproduce NB=05"),
    "debate_results": Artifact("05_debate", "results_{variant}.jsonl", "make reproduce NB=05"),
    # what the figures read (lib/<paper>/figures.py names these, never a path)
    "memeworld_datasheet": Artifact("00_data_prep", "memeworld/datasheet.json", "make reproduce NB=00"),
    "data_gallery": Artifact("00_data_prep", "gallery.json", "make reproduce NB=00"),
    "models_metrics": Artifact("models", "metrics.json", "make reproduce NB=models"),
    "model_training": Artifact("models", "{model}/training.json", "make reproduce NB=models"),
    "serving_metrics": Artifact("serving", "metrics.json", "make reproduce NB=serving"),
    "serving_settings": Artifact("serving", "settings.json", "make reproduce NB=serving"),
    "captioning_examples": Artifact("01_captioning", "examples.json", "make reproduce NB=01"),
    "captioning_metrics": Artifact("01_captioning", "metrics.json", "make reproduce NB=01"),
    "trace_selected_share": Artifact("02_finetuning", "selected_share.csv", "make reproduce NB=02"),
    "trace_per_type": Artifact("02_finetuning", "per_type.csv", "make reproduce NB=02"),
    "trace_claims": Artifact("02_finetuning", "claims.csv", "make reproduce NB=02"),
    "clip4dm_epsilon_sweep": Artifact("03_clip4dm", "epsilon_sweep.csv", "make reproduce NB=03"),
    "clip4dm_by_encoder": Artifact("03_clip4dm", "by_encoder.csv", "make reproduce NB=03"),
    "clip4dm_foil_table": Artifact("03_clip4dm", "foil_table.csv", "make reproduce NB=03"),
    "clip4dm_hard_negatives": Artifact("03_clip4dm", "hard_negatives.csv", "make reproduce NB=03"),
    "clip4dm_examples": Artifact("03_clip4dm", "examples.json", "make reproduce NB=03"),
    "clip4dm_results": Artifact("03_clip4dm", "results_{benchmark}.csv", "make reproduce NB=03"),
    "clip4dm_claims": Artifact("03_clip4dm", "claims.csv", "make reproduce NB=03"),
    "sei_coherence": Artifact("04_few_shot", "coherence.csv", "make reproduce NB=04"),
    "sei_claims": Artifact("04_few_shot", "claims.csv", "make reproduce NB=04"),
    "sei_retrieval": Artifact("04_few_shot", "retrieval.csv", "make reproduce NB=04"),
    "sei_cold_runs": Artifact("04_few_shot", "cold_runs.csv", "make reproduce NB=04"),
    "sei_adapted": Artifact("04_few_shot", "adapted.json", "make reproduce NB=04"),
    "sei_adapted_predictions": Artifact("04_few_shot", "predictions_adapted.jsonl", "make reproduce NB=04"),
    "sei_adapted_claims": Artifact("04_few_shot", "claims_adapted.csv", "make reproduce NB=04"),
    "debate_eval": Artifact("05_debate", "eval_{variant}.json", "make reproduce NB=05"),
    "debate_claims": Artifact("05_debate", "claims.csv", "make reproduce NB=05"),
    "debate_cold_runs": Artifact("05_debate", "cold_runs.csv", "make reproduce NB=05"),
    "debate_adapted_claims": Artifact("05_debate", "claims_adapted.csv", "make reproduce NB=05"),
    "evaluation_comparison": Artifact("06_evaluation", "comparison.csv", "make reproduce NB=06"),
    "evaluation_common": Artifact("06_evaluation", "common.json", "make reproduce NB=06"),
    "evaluation_mcnemar": Artifact("06_evaluation", "mcnemar.csv", "make reproduce NB=06"),
    "evaluation_injection": Artifact("06_evaluation", "injection.csv", "make reproduce NB=06"),
    "evaluation_gallery": Artifact("06_evaluation", "gallery.json", "make reproduce NB=06"),
}


class MissingInputError(FileNotFoundError):
    """A stage's declared input is absent; the message names the producer."""


def stage_dir(profile: str, stage: str, create: bool = True) -> Path:
    d = ARTIFACTS_ROOT / profile / stage
    if create:
        d.mkdir(parents=True, exist_ok=True)
    return d


def require(profile: str, name: str, consumer: str, **fields: str) -> Path:
    """Path of declared artifact `name`, or fail at once naming what produces it."""
    art = ARTIFACTS[name]
    p = art.path(profile, **fields)
    if not p.exists():
        raise MissingInputError(
            f"{consumer} needs {relpath(p)} (artifact '{name}', profile '{profile}'), which is "
            f"missing. Produce it with `{art.make_target}`"
            + (f" (PROFILE={profile})" if profile != "embedded" else "") + " first.")
    return p


def declared(profile: str, name: str, **fields: str) -> Path:
    """Path of declared artifact `name`, present or not (for readers that accept its absence)."""
    return ARTIFACTS[name].path(profile, **fields)


def project_path(p: Path | str) -> Path:
    """A path a profile names: absolute as given, relative to the repository root otherwise (the
    profiles' convention, whatever folder the notebook or process runs in)."""
    p = Path(p).expanduser()
    return p if p.is_absolute() else ROOT / p


def relpath(p: Path | str) -> str:
    """A path relative to the repository root when it lies inside it (for messages/outputs)."""
    p = Path(p).resolve()
    try:
        return str(p.relative_to(ROOT))
    except ValueError:
        return str(p)


# ----------------------------------------------------------------------------- atomic writes
def pid_alive(pid: int) -> bool:
    """Whether a process of this host is running under `pid` (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep_stale_temporaries(target: Path) -> None:
    """Remove the temporaries of `target` that a killed writer left (`.<name>.<pid>.<random>.tmp`
    whose pid is no longer running); a live writer's temporary is left alone."""
    prefix = f".{target.name}."
    for f in target.parent.glob(f"{glob.escape(prefix)}*.tmp"):
        pid = f.name[len(prefix):].split(".", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            with contextlib.suppress(OSError):
                f.unlink()


_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process's umask, read without changing it where Linux shows it (/proc/self/status); elsewhere set and
    restored under a lock (the only portable way to read it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def plain_open_mode(target: Path) -> int:
    """The permission bits a plain `open(target, "w")` would leave: an existing file keeps its own, a new one gets
    0o666 less the umask (a temporary file from mkstemp is 0o600 whatever the umask, and a rename keeps that)."""
    try:
        return stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        return 0o666 & ~current_umask()


def fsync_path(path: Path | str, directory: bool = False) -> None:
    """Flush a file's (or a folder's entries') data to the disk. A folder that cannot be opened for it (some
    file systems refuse) is left to the kernel: the rename is then atomic but not yet durable."""
    try:
        fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0))
    except OSError:
        if directory:
            return
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not directory:
            raise
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(target: Path | str) -> Iterator[Path]:
    """Yield a temporary path next to `target`; rename it over `target` on success. The temporary
    is removed on any failure, and the temporaries a killed writer left beside `target` are removed
    when it is next written, so no `.tmp` file outlives the writes. The file gets the mode a plain
    `open` would give it (`plain_open_mode`: the umask applied, an existing file's own kept), and is
    durable when the call returns: its data is flushed before the rename and its folder's entry after,
    so a power cut leaves the old file or the new one, never an empty or half-written one."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    _sweep_stale_temporaries(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.{os.getpid()}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        strays = sorted(target.parent.glob(f"{glob.escape(tmp_path.name)}.*"))
        if strays:                  # a writer that added its own suffix (np.save adds .npy) wrote elsewhere
            raise OSError(f"writing {target}: the writer wrote {strays[0].name} instead of the temporary file it was "
                          f"given; pass it an open file object (or a name it keeps as is)")
        os.chmod(tmp_path, plain_open_mode(target))
        fsync_path(tmp_path)
        os.replace(tmp_path, target)
        fsync_path(target.parent, directory=True)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()
        for stray in target.parent.glob(f"{glob.escape(tmp_path.name)}.*"):
            stray.unlink()


def write_bytes(target: Path | str, data: bytes) -> Path:
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)
    return Path(target)


def write_text(target: Path | str, text: str) -> Path:
    return write_bytes(target, text.encode("utf-8"))


def read_jsonl(path: Path | str) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file (blank lines skipped): the one reader of the compendium's own
    JSONL artifacts (dataset files go through lib.data.readers, which name the line of a bad record)."""
    return [json.loads(x) for x in Path(path).read_text(encoding="utf-8").splitlines() if x.strip()]


#: "sk-" as a credential scanner reads it (an API key's prefix); in model text it is mostly words ("Task-Task")
_KEY_PREFIX = re.compile(r"(?i)(sk)-")


def write_jsonl(target: Path | str, rows: Any, default: Callable[[Any], Any] | None = None) -> Path:
    """Rows as JSON lines (UTF-8 kept as is, one object a line), written atomically; `default` as json.dumps's.
    A model's text can hold "sk-" ("Task-Task"), which credential scanners flag in a committed file: its hyphen
    is written as the JSON escape \\u002d, so the file reads back to exactly the same rows."""
    return write_text(target, "".join(_KEY_PREFIX.sub(r"\1\\u002d", json.dumps(r, ensure_ascii=False, default=default))
                                      + "\n" for r in rows))


def write_json(target: Path | str, obj: Any, indent: int | None = 1) -> Path:
    return write_text(target, json.dumps(obj, indent=indent, sort_keys=False, ensure_ascii=False) + "\n")


def write_csv(target: Path | str, frame, drop_if_empty: bool = False) -> Path | None:
    """A DataFrame as CSV (no index), atomically. `drop_if_empty`: an empty frame writes nothing and
    removes an older file of that name (so a figure drawn "where its artifact exists" is not drawn
    from a stale one); returns None then."""
    target = Path(target)
    if drop_if_empty and len(frame) == 0:
        target.unlink(missing_ok=True)
        return None
    return write_text(target, frame.to_csv(index=False))


def write_with(target: Path | str, writer: Callable[[Path], None]) -> Path:
    """Atomic write through a function that writes to a given path (e.g. torch.save)."""
    with atomic_path(target) as tmp:
        writer(tmp)
    return Path(target)


def loads_strict(text: str, where: str = "", error: type[Exception] = ValueError,
                 duplicate_error: type[Exception] | None = None) -> Any:
    """json.loads that refuses what no reader here can mean: a duplicate key in an object (the
    first value would be lost silently), NaN / Infinity, numbers that overflow to infinity, and
    nesting the decoder cannot hold. The one strict reader behind model answers
    (`lib.models.chat.structured`) and dataset files (`lib.data.datasets`); failures raise `error` with
    `where` (a file and record, or nothing) in front (a repeated key raises `duplicate_error`
    when given, for callers that treat it apart). A malformed document still raises
    json.JSONDecodeError, which callers turn into their own message with its line and column."""
    at = f"{where}: " if where else ""

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in pairs:
            if k in out:
                raise (duplicate_error or error)(f"{at}duplicate key {k!r} in a JSON object (the first value would be lost)")
            out[k] = v
        return out

    def constant(name: str) -> Any:
        return _NonFinite(name)

    def finite(token: str) -> Any:
        v = float(token)
        return _NonFinite(token) if v in (float("inf"), float("-inf")) else v

    try:
        value = json.loads(text, object_pairs_hook=no_duplicates, parse_constant=constant, parse_float=finite)
    except RecursionError:
        raise error(f"{at}nested deeper than the JSON decoder allows") from None
    bad = _first_non_finite(value)
    if bad is not None:
        path, token = bad
        raise error(f"{at}{f'field {path!r} is ' if path else ''}{token}, not a finite JSON number "
                    f"(NaN and Infinity are not JSON)")
    return value


class _NonFinite(str):
    """NaN, Infinity or a number that overflows, as the decoder met it (found and named after decoding)."""


def _first_non_finite(value: Any, path: str = "") -> tuple[str, str] | None:
    """(the key path, the token) of the first non-finite number in a decoded document, or None."""
    stack = [(value, path)]
    while stack:
        v, p = stack.pop()
        if isinstance(v, _NonFinite):
            return p, str(v)
        if isinstance(v, dict):
            stack += [(x, f"{p}.{k}" if p else str(k)) for k, x in reversed(list(v.items()))]
        elif isinstance(v, list):
            stack += [(x, f"{p}[{i}]") for i, x in reversed(list(enumerate(v)))]
    return None


def read_json(path: Path | str) -> Any:
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{relpath(path)}: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}") from e


# ----------------------------------------------------------------------------- manifests
def params_hash(params: dict) -> str:
    blob = json.dumps(params, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def git_revision() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (rev or "unknown") + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def package_versions(names: tuple[str, ...] = TRACKED_PACKAGES) -> dict[str, str]:
    out = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            out[n] = "absent"
    return out


def write_manifest(directory: Path, params: dict, outputs: list[str] | None = None,
                   inputs: dict[str, str] | None = None) -> Path:
    """manifest.json for a stage folder: what produced it, from which parameters and code."""
    manifest = {
        "params_hash": params_hash(params),
        "params": params,
        "git_revision": git_revision(),
        "packages": package_versions(),
        "outputs": sorted(outputs or []),
        "inputs": inputs or {},
    }
    return write_json(Path(directory) / "manifest.json", manifest)


def write_metrics(profile: str, stage: str, metrics: dict[str, Any]) -> Path:
    """Headline numbers of a stage as one flat JSON object (what the README table reads)."""
    for k, v in metrics.items():
        if isinstance(v, (dict, list, tuple)):
            raise TypeError(f"metrics of {stage}: key '{k}' is a {type(v).__name__}; metrics.json is flat")
    clean = {k: (round(float(v), 6) if isinstance(v, float) else v) for k, v in metrics.items()}
    return write_json(stage_dir(profile, stage) / "metrics.json", clean)


def read_metrics(profile: str, stage: str) -> dict[str, Any]:
    p = ARTIFACTS_ROOT / profile / stage / "metrics.json"
    return read_json(p) if p.exists() else {}


def file_digest(path: Path | str, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


# ----------------------------------------------------------------------------- command lines
def cli_error(error: BaseException | str) -> int:
    """A command line's refusal: `error: <what>` on stderr, and the exit status 2 to return."""
    print(f"error: {error}", file=sys.stderr)
    return 2


# ----------------------------------------------------------------------------- model folders
def save_folder_atomically(out_dir: Path, write: Any) -> None:
    """Write a whole folder through `write(tmp_dir)` into a hidden sibling, then swap the folders by
    two renames: a reader sees the old folder, no folder, or the new one, never a mix (a kill
    between the renames leaves no folder, so the model is trained again). Its files get the mode a plain
    `open` would give them (the umask applied) and are flushed to the disk before the swap, the swap itself after it. Leftovers of a killed
    swap (hidden siblings) are removed first."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.parent.glob(f".{out_dir.name}.*.swap"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = out_dir.with_name(f".{out_dir.name}.{os.getpid()}.new.swap")
    old = out_dir.with_name(f".{out_dir.name}.{os.getpid()}.old.swap")
    tmp.mkdir()
    try:
        write(tmp)
        mask = current_umask()
        for f in sorted(tmp.rglob("*")):           # every file's data on the disk before the folder is swapped in
            if f.is_file() and not f.is_symlink():
                # the mode a plain open would give it: a writer's own temporary-and-rename (safetensors'
                # save_file writes 0o600 whatever the umask) leaves a file nobody else can read
                os.chmod(f, 0o666 & ~mask)
                fsync_path(f)
        for d in sorted({f.parent for f in tmp.rglob("*")} | {tmp}):
            fsync_path(d, directory=True)
        if out_dir.exists():
            os.replace(out_dir, old)
        os.replace(tmp, out_dir)
        fsync_path(out_dir.parent, directory=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


def save_model(model, proc, out_dir: Path, record: dict[str, Any] | None = None,
               state_dict: dict[str, Any] | None = None) -> None:
    """The model, its processor and (when given) its training record as training.json, swapped in
    as one folder (memeworld-vlm here, the agents of notebook 04 through lib.sei.agents). `state_dict`: the full
    weights gathered from a sharded (FSDP) model, saved in place of the module's own."""
    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, **({"state_dict": state_dict} if state_dict is not None else {}))
        proc.save_pretrained(tmp)
        if record is not None:
            write_json(tmp / "training.json", record)
    save_folder_atomically(out_dir, write)


def save_weights(model, path: Path) -> None:
    """A torch module's weights as one safetensors file (the format every embedded model ships in)."""
    from safetensors.torch import save_file
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(path), metadata={"format": "pt"})


# ----------------------------------------------------------------------------- outputs a step kept
REUSED = ".reused.json"


def mark_reused(folder: Path, reason: str) -> None:
    """A stage step that found its outputs current and kept them says so (lib.compendium.outputs then accepts
    them as this run's)."""
    write_json(Path(folder) / REUSED, {"reason": reason, "at": time.time()})


def reused_since(folder: Path, since: float) -> bool:
    """Whether a step of this run (started at `since`) said it kept the folder's outputs."""
    f = Path(folder) / REUSED
    return f.exists() and f.stat().st_mtime >= since - 1
