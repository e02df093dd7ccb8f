"""`make lab`: JupyterLab on copies of the notebooks prepared for one profile, with the environment `make` gives.

    make lab                        # the ci profile (small sizes: minutes on 2 cores)
    make lab PROFILE=my-ablation    # a child profile of yours (params/my-ablation.yaml: `extends: embedded`, ...)

The saved notebooks under notebooks/ carry the embedded profile's injected parameters and outputs: opened there,
Run All would run at full size, outside the runner, and write the embedded profile's artifacts and figures. So Lab
opens on copies in artifacts/<profile>/lab/, each with that profile's parameters injected by papermill (the cell
tagged `injected-parameters` says which profile and sizes a kernel runs). Whatever they run writes under
artifacts/<profile>/ only (for a profile other than embedded and paper, figures too): the committed notebooks,
results and figures stay as they are. The kernel is the project's .venv, started with the Makefile's environment
(offline hubs, PYTHONHASHSEED, the pinned CPU numerics). A copy you edited is kept when Lab is opened again;
`--fresh` prepares it anew. To switch profile, open Lab with another PROFILE (each has its own copies).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from lib import ROOT
from lib.compendium.artifacts import ARTIFACTS_ROOT, PUBLISHED_PROFILES, cli_error, relpath
from lib.compendium.params import ProfileError, stages, validate_profile
from lib.compendium.stages import run_env


def lab_dir(profile: str) -> Path:
    return ARTIFACTS_ROOT / profile / "lab"


def prepare(profile: str, fresh: bool = False, dest: Path | None = None) -> list[Path]:
    """The profile's copies of every stage notebook, parameters injected (nothing runs); an existing copy is kept
    (it may hold your edits) unless `fresh`. Returns their paths in stage order."""
    import papermill as pm
    sections = validate_profile(profile)
    dest = dest or lab_dir(profile)
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for st in stages():
        if st.notebook is None:
            continue
        target = dest / st.notebook.name
        if fresh or not target.exists():
            pm.execute_notebook(str(st.notebook), str(target), parameters={"profile": profile, **sections[st.name]},
                                prepare_only=True, kernel_name="python3", progress_bar=False)
        out.append(target)
    return out


def command(profile: str, port: int | None = None, browser: bool | None = None,
            notebook_dir: Path | None = None) -> tuple[list[str], dict[str, str]]:
    """The JupyterLab command line and environment `make lab` runs."""
    browser = bool(os.environ.get("DISPLAY")) if browser is None else browser
    d = notebook_dir or lab_dir(profile)
    cmd = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={d}"]
    if not browser:
        cmd.append("--no-browser")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")                   # a container's root (as CI's): Jupyter refuses it otherwise
    if port:
        cmd.append(f"--port={port}")
    env = run_env()
    env["COMPENDIUM_LAB_PROFILE"] = profile
    return cmd, env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="ci")
    ap.add_argument("--fresh", action="store_true", help="prepare every copy anew (your edits to the copies are lost)")
    ap.add_argument("--prepare-only", action="store_true", help="prepare the copies and print the command; start nothing")
    ap.add_argument("--port", type=int, default=None)
    a = ap.parse_args(argv)
    try:
        nbs = prepare(a.profile, fresh=a.fresh)
    except ProfileError as e:
        return cli_error(e)
    print(f">> {len(nbs)} notebooks prepared for profile {a.profile} in {relpath(lab_dir(a.profile))}/ "
          f"(their injected-parameters cell says what they run; they write under artifacts/{a.profile}/)")
    if a.profile in PUBLISHED_PROFILES:
        print(f"warning: profile {a.profile} is published: a Run All rewrites figures/{a.profile}/ (tracked) and its "
              f"artifacts take hours at full size; try a change under `ci` or a child profile instead", file=sys.stderr)
    cmd, env = command(a.profile, a.port)
    if a.prepare_only:
        print(" ".join(cmd))
        return 0
    os.chdir(ROOT)
    os.execvpe(cmd[0], cmd, env)
    return 0                                             # not reached


if __name__ == "__main__":
    raise SystemExit(main())
