"""Parameter profiles (`params/<profile>.yaml`) and their validation.

A profile holds one section per stage: one per numbered notebook (keyed by the
notebook's stem, e.g. `02_finetuning`) and one per python step. A stage's
section must name exactly the variables of the notebook's `parameters` cell, with
the same types; papermill alone would only warn about an unknown parameter, so
every run validates first and fails naming the file, the stage and the key.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import hashlib
import importlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal

import yaml

from lib.compendium.artifacts import cli_error
from lib import ROOT
from lib.compendium.param_schemas import SCHEMAS, Opt, Range, _dataclass_fields, check_section

PARAMS_DIR = ROOT / "params"
NOTEBOOKS_DIR = ROOT / "notebooks"


#: The profile section that is no stage's: how the stages execute and their time limits (lib.compendium.execution).
RUNNER_SECTION = "runner"

@dataclass(frozen=True)
class RunnerConfig:
    """How a profile's stages execute and how long they may take (the profile's `runner:` section)."""
    executor: Literal["papermill", "nbval"] = "papermill"   # nbval: the checked cells compared with the reference
    timeout_multiple: float = 4.0         # a limit is this many times the longest recorded time...
    cell_floor_s: float = 900.0           # ...and never under these floors
    stage_floor_s: float = 1800.0
    unrecorded_stage_s: float = 4 * 3600.0   # a stage with no recorded time (the whole budget of `make reproduce`)
    cell_timeout_s: float | None = None   # set: every cell's limit, whatever was recorded (the paper profile's long cells)
    stage_timeout_s: float | None = None  # set: every stage's limit


def runner_config(sections: dict[str, Any]) -> RunnerConfig:
    """The RunnerConfig of a loaded profile (its `runner` section over the defaults)."""
    return RunnerConfig(**(sections.get(RUNNER_SECTION) or {}))


def runner_schema():
    """The rule of the `runner` section: RunnerConfig's annotations, limits positive, the multiple at least 1."""
    pos = Range(1)
    return _dataclass_fields(RunnerConfig, timeout_multiple=Range(1), cell_floor_s=pos, stage_floor_s=pos,
                             unrecorded_stage_s=pos, cell_timeout_s=Opt(pos), stage_timeout_s=Opt(pos))


#: Parameters every notebook declares but no profile sets: the runner injects them.
RESERVED = {"profile"}


class ProfileError(ValueError):
    """A profile does not match the stages' declared parameters."""


@dataclass(frozen=True)
class Stage:
    name: str                       # section name in the profile, e.g. "00_data_prep"
    notebook: Path | None = None    # executed with papermill
    module: str | None = None       # or a python step: `python -m <module> --profile P`
    schema: Callable[[], dict[str, Any]] | None = None  # python step: default parameters

    @property
    def label(self) -> str:
        return f"notebooks/{self.notebook.name}" if self.notebook else f"stage '{self.name}' ({self.module})"


#: Python steps between notebooks: (stage name, runs after the notebook with this prefix, module).
#: The module defines `Config` (a dataclass: the stage's parameters) and `main(argv)`
#: taking `--profile`. Later issues register theirs here (e.g. the embedded models).
PYTHON_STAGES: list[tuple[str, str, str]] = [
    ("models", "00", "lib.models.embedded"),   # memeworld-clip, memeworld-vlm (embedded profile)
    ("serving", "03", "lib.models.serving"),          # llama.cpp server vs transformers, same GGUF (benchmark)
]


def _module_schema(module: str) -> Callable[[], dict[str, Any]]:
    def schema() -> dict[str, Any]:
        cfg = importlib.import_module(module).Config
        return {f.name: (f.default if f.default is not dataclasses.MISSING else f.default_factory())
                for f in dataclasses.fields(cfg)}
    return schema


def module_section_problems(stage: Stage, section: dict[str, Any]) -> list[str]:
    """A python step's section checked against its Config's type annotations (unknown keys are reported apart)."""
    assert stage.module is not None
    rule = _dataclass_fields(importlib.import_module(stage.module).Config)
    rule.open = True
    return rule.check(section, stage.name)


def stages() -> list[Stage]:
    """Stages in run order: the numbered notebooks that exist, python steps after their notebook."""
    nbs = sorted(p for p in NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))
    out: list[Stage] = []
    for nb in nbs:
        out.append(Stage(nb.stem, notebook=nb))
        for name, after, module in PYTHON_STAGES:
            if nb.stem.startswith(after + "_"):
                out.append(Stage(name, module=module, schema=_module_schema(module)))
    return out


def select_stages(only: str | None) -> list[Stage]:
    """`only` is a number prefix ("03"), a stem or a python step's name; None selects all stages."""
    all_ = stages()
    if not only:
        return all_
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    picked = [s for s in all_ if any(s.name == w or s.name.startswith(w + "_") for w in wanted)]
    if len(picked) != len(wanted):
        raise ProfileError(f"unknown stage in NB={only!r}; stages are: {', '.join(s.name for s in all_)}")
    return picked


# ----------------------------------------------------------------------------- parameters cells
def parameters_cell(notebook: Path) -> dict[str, Any]:
    """Variables assigned in the notebook's cell tagged `parameters` (literals only)."""
    import nbformat
    nb = nbformat.read(str(notebook), as_version=4)
    cells = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        raise ProfileError(f"notebooks/{notebook.name}: expected exactly one cell tagged 'parameters', "
                           f"found {len(cells)}")
    out: dict[str, Any] = {}
    tree = ast.parse(cells[0].source)
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if not isinstance(t, ast.Name):
                    raise ProfileError(f"notebooks/{notebook.name}: parameters cell assigns to a non-name")
                try:
                    out[t.id] = ast.literal_eval(node.value)
                except ValueError as e:
                    raise ProfileError(f"notebooks/{notebook.name}: parameter '{t.id}' must be a literal") from e
    return out


def stage_defaults(stage: Stage) -> dict[str, Any]:
    if stage.notebook is not None:
        return parameters_cell(stage.notebook)
    assert stage.schema is not None
    return stage.schema()


# ----------------------------------------------------------------------------- profiles
PROFILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def profile_path(profile: str) -> Path:
    if not isinstance(profile, str) or not PROFILE_NAME.match(profile) or ".." in profile:
        raise ProfileError(f"profile name {profile!r} is not a plain name (letters, digits, '_', '-', '.'): "
                           f"a profile is a file params/<name>.yaml")
    return PARAMS_DIR / f"{profile}.yaml"


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key twice in one mapping (YAML itself lets the last one win)."""


def _construct_mapping(loader, node, deep=False):
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise ProfileError(f"duplicate key {key!r} at line {key_node.start_mark.line + 1} "
                               f"(first at line {seen[key] + 1}): the second would silently replace the first")
        seen[key] = key_node.start_mark.line
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


class Replace(dict):
    """A mapping a child profile tagged `!replace`: it replaces the parent's mapping whole instead of
    merging into it (the way to drop a parent's variant or dataset)."""


def _construct_replace(loader, node):
    if not isinstance(node, yaml.MappingNode):
        raise ProfileError(f"'!replace' at line {node.start_mark.line + 1} tags a mapping; lists and values "
                           f"replace the parent's whole already")
    return Replace(_construct_mapping(loader, node, deep=True))


_UniqueKeyLoader.add_constructor("!replace", _construct_replace)


def merge(parent: Any, child: Any) -> Any:
    """What `extends` does to one value: mappings merge key by key at every depth (a key the child
    does not name keeps the parent's value); everything else the child names replaces the parent's
    whole: lists, scalars, a mapping tagged `!replace`, and `null`, which means "unset" (the value
    becomes null; to keep the parent's value, leave the key out)."""
    if isinstance(child, Replace):
        return dict(child)
    if isinstance(parent, dict) and isinstance(child, dict):
        out = dict(parent)
        for k, v in child.items():
            out[k] = merge(parent[k], v) if k in parent else _plain(v)
        return out
    return _plain(child)


def _plain(v: Any) -> Any:
    """A value with its `!replace` tags dropped (they only mean something against a parent)."""
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def kept_from_parent(parent: Any, child: Any, prefix: str = "") -> list[str]:
    """The key paths a partial nested mapping keeps from the parent (what a one-level merge lost)."""
    if isinstance(child, Replace) or not (isinstance(child, dict) and isinstance(parent, dict)):
        return []
    out = [f"{prefix}{k}" for k in parent if k not in child]
    for k, v in child.items():
        if k in parent:
            out += kept_from_parent(parent[k], v, f"{prefix}{k}.")
    return out


def load_profile(profile: str, _seen: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """A profile's sections. A profile may start with `extends: <profile>`: it then holds only what
    differs, merged into the other profile by `merge` (nested mappings key by key at every depth;
    lists, values and `null` replace; a mapping tagged `!replace` replaces the parent's whole). The
    paper-smoke profile is the paper profile with small sizes and local stand-ins; the ci profile
    is the embedded one at test sizes."""
    data, parent = _parent_and_own(profile, _seen)
    if parent is None:
        return _plain(data)
    return merge(load_profile(parent, (*_seen, profile)), data)


def section_digest(section: dict[str, Any] | None) -> str:
    """A short digest of one stage's parameters: timings.json records it beside each time, so that a time
    measured at other parameters (a grown evaluation set) is told apart from one at the current ones."""
    blob = json.dumps(section or {}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _parent_and_own(profile: str, _seen: tuple[str, ...] = ()) -> tuple[dict[str, Any], str | None]:
    if profile in _seen:
        raise ProfileError(f"params/{profile}.yaml: 'extends' loops ({' -> '.join((*_seen, profile))})")
    data = _load_file(profile)
    parent = data.pop("extends", None)
    if parent is not None and not isinstance(parent, str):
        raise ProfileError(f"params/{profile}.yaml: 'extends' names one profile, got {parent!r}")
    return data, parent


def ancestors(profile: str) -> list[str]:
    """The profiles `profile` extends, nearest first (ci -> [embedded]; a child of ci -> [ci, embedded])."""
    out, seen = [], [profile]
    while True:
        try:
            parent = _parent_and_own(seen[-1], tuple(seen[:-1]))[1]
        except ProfileError:
            return out
        if parent is None or parent in seen:
            return out
        out.append(parent)
        seen.append(parent)


def effective_changes(profile: str) -> list[tuple[str, Any, list[str]]]:
    """(section.key, effective value, keys kept from the parent) for every parameter a child
    profile's own file sets, after merging: what `make check-params` prints, so that a partial
    nested mapping shows the whole value it became."""
    data, parent = _parent_and_own(profile)
    if parent is None:
        return []
    merged, base = load_profile(profile), load_profile(parent)
    out = []
    for section, values in data.items():
        for key, v in values.items():
            old = base.get(section, {}).get(key)
            out.append((f"{section}.{key}", merged[section][key], kept_from_parent(old, v)))
    return out


def is_paper(profile: str) -> bool:
    """The paper profile or one that extends it (paper-smoke): the paper's own numbers are shown beside
    its rows, so that code runs wherever the paper profile's does."""
    seen = []
    while profile and profile not in seen:
        if profile == "paper":
            return True
        seen.append(profile)
        try:
            profile = _load_file(profile).get("extends")
        except ProfileError:
            return False
    return False


def _load_file(profile: str) -> dict[str, Any]:
    path = profile_path(profile)
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in PARAMS_DIR.glob("*.yaml")))
        raise ProfileError(f"no profile '{profile}': {path.relative_to(ROOT)} does not exist (known: {known})")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader) or {}
    except ProfileError as e:
        raise ProfileError(f"params/{path.name}: {e}") from None
    except yaml.YAMLError as e:
        raise ProfileError(f"params/{path.name}: not valid YAML: {e}") from e
    if not isinstance(data, dict) or not all(isinstance(v, dict) for k, v in data.items() if k != "extends"):
        raise ProfileError(f"params/{path.name}: expected a mapping of stage name -> mapping of parameters")
    return data


def _type_name(v: Any) -> str:
    return "null" if v is None else type(v).__name__


def _compatible(default: Any, value: Any) -> bool:
    if default is None or value is None:
        return True  # None in the notebook means "optional / any"; null in the profile means "unset"
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    if isinstance(default, (list, tuple)):
        return isinstance(value, (list, tuple))
    return isinstance(value, type(default))


def validate_profile(profile: str, only: list[Stage] | None = None) -> dict[str, dict[str, Any]]:
    """Check every stage's section against its declared parameters; return the sections.

    Raises ProfileError naming the file, the stage (notebook) and the key on an unknown,
    missing or mistyped key, a missing section, or a section for no stage.
    """
    data = load_profile(profile)
    fname = f"params/{profile}.yaml"
    all_stages = stages()
    known = {s.name for s in all_stages}
    errors: list[str] = []
    for section in data:
        if section == RUNNER_SECTION:          # how the stages execute and how long they may take (no stage)
            errors += [f"{fname}: key '{w}': {m}" for w, _, m in
                       (p.partition(": ") for p in runner_schema().check(data[section], RUNNER_SECTION))]
        elif section not in known:
            errors.append(f"{fname}: section '{section}' matches no stage (stages: {', '.join(sorted(known))}, "
                          f"and {RUNNER_SECTION})")
    for st in (only or all_stages):
        if st.name not in data:
            errors.append(f"{fname}: missing section '{st.name}' for {st.label}")
            continue
        declared = {k: v for k, v in stage_defaults(st).items() if k not in RESERVED}
        given = data[st.name]
        for key in RESERVED & set(given):
            errors.append(f"{fname}: key '{st.name}.{key}' is set by the runner, not by a profile")
        for key in given:
            if key not in declared:
                errors.append(f"{fname}: unknown key '{st.name}.{key}' for {st.label} "
                              f"(declared: {', '.join(sorted(declared))})")
        rules = SCHEMAS.get(st.name, {})
        for key, default in declared.items():
            if key not in given:
                errors.append(f"{fname}: missing key '{st.name}.{key}' for {st.label}")
            elif not _compatible(default, given[key]):
                errors.append(f"{fname}: key '{st.name}.{key}' for {st.label} is {_type_name(given[key])} "
                              f"({given[key]!r}); the parameters cell declares {_type_name(default)} ({default!r})")
            if default is None and key not in rules and st.module is None:
                errors.append(f"{fname}: key '{st.name}.{key}' defaults to None in {st.label}, so its type cannot "
                              f"be checked: give it a rule in lib/compendium/param_schemas.py")
        problems = check_section(st.name, given)
        if st.module is not None:           # a python step's optional parameters: its Config's annotations
            optional = {k for k, d in declared.items() if d is None and k not in rules}
            problems += [p for p in module_section_problems(st, {k: v for k, v in given.items() if k in optional})]
        for problem in problems:
            where, _, msg = problem.partition(": ")
            errors.append(f"{fname}: key '{where}': {msg}")
    if errors:
        raise ProfileError("\n".join(errors))
    return data


#: files and folders a profile names that must exist on this machine before any stage runs
#: (section, key path) -> where to get it; a value that refers to {artifacts} is made by a stage
LOCAL_FILES: dict[tuple[str, ...], str] = {
    ("01_captioning", "tag_vocabulary_file"): "RAM++'s tag list (ram_tag_list.txt in the recognize-anything "
                                              "repository, one tag per line)",
    ("04_few_shot", "bertscore", "model"): "a local copy of roberta-large (e.g. `huggingface-cli download "
                                           "FacebookAI/roberta-large --local-dir data/models/roberta-large`), "
                                           "or a preset name such as minilm",
    ("05_debate", "official_prompts_repo"): "a checkout of the official ARCADE repository (its prompt constants)",
    ("05_debate", "world_knowledge"): "a world-knowledge text file for the court (params/prompts/arcade/world/)",
    ("03_clip4dm", "nli_model"): "a local NLI model folder (or a hub id such as facebook/bart-large-mnli)",
}


def _looks_local(value: str) -> bool:
    """A path on this machine, not a hub id ("org/name") or a preset name."""
    return value.startswith(("/", "./", "../", "~", "data/", "params/", "artifacts/")) or value.endswith(".txt")


def missing_local_files(profile: str) -> list[str]:
    """Every local file or folder the profile names (LOCAL_FILES) that does not exist, each with
    where to get it: one list, so a first paper run learns everything it lacks before any stage runs."""
    p = load_profile(profile)
    out = []
    for keys, where in LOCAL_FILES.items():
        v: Any = p
        for k in keys:
            v = v.get(k) if isinstance(v, dict) else None
        if not isinstance(v, str) or "{artifacts}" in v or not _looks_local(v):
            continue
        path = Path(v).expanduser()
        path = path if path.is_absolute() else ROOT / path
        if not path.exists():
            out.append(f"  - {'.'.join(keys)}: {v} does not exist\n      get it: {where}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Validate a parameter profile against the stages.")
    ap.add_argument("--profile", default="embedded")
    args = ap.parse_args(argv)
    try:
        validate_profile(args.profile)
    except ProfileError as e:
        return cli_error(e)
    print(f"params/{args.profile}.yaml: OK ({len(stages())} stages)")
    try:
        changes = effective_changes(args.profile)
    except ProfileError:
        changes = []
    if changes:
        parent = _parent_and_own(args.profile)[1]
        print(f"what it sets over params/{parent}.yaml, as merged (nested mappings merge key by key; lists, values "
              f"and null replace; a mapping tagged !replace replaces the parent's whole):")
        for path, value, kept in changes:
            print(f"  {path}: {json.dumps(value, default=str)}")
            if kept:
                print(f"      kept from {parent}: {', '.join(kept)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
