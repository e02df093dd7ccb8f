"""Runs the stages: `make reproduce` (papermill) and `make test` (pytest + nbval).

Embedded-profile notebooks are executed in place, so the committed notebooks carry
the embedded run's outputs and read as the paper's narrative on any git host; other
profiles write their executed notebooks under `artifacts/<profile>/notebooks/`.
Saved notebooks are scrubbed of timestamps, absolute paths, progress bars and
anything that looks like a secret.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from lib import ROOT
from lib.artifacts import write_text
from lib.chat import loopback
from lib.chat.keys import read_dotenv, remembered_env_files
from lib.params import ProfileError, Stage, select_stages, validate_profile
from lib.presets import OVERLAY_ENV, overlay_path, presets, read_overlay, resolve_model_path
from lib.results import README_PROFILES, update_readme

#: the profile `make test` runs after the embedded stages: the paper profile on tiny stand-ins
SMOKE_PROFILE = "paper-smoke"
SECRET_ENV = re.compile(r"(API_KEY|TOKEN|SECRET|PASSWORD)", re.I)
#: An absolute path outside the project and the home folder (those are made relative first): a
#: "/" that does not continue a word, a URL or a relative path, followed by at least one folder.
ABS_PATH = re.compile(r"(?<![\w:/.~\-}])/(?:[^\s\"'/:,;()\[\]{}<>]+/)+")


def loaded_secrets() -> list[str]:
    """Every secret the compendium may have loaded: environment variables, `.env` entries and the
    entries of every other env file keys were read from (lib.chat remembers them) whose names look
    secret, and every key named by a chat preset's api_key_env (with its _1, _2...)."""
    sources = [dict(os.environ)]
    for f in [ROOT / ".env", *remembered_env_files()]:
        try:
            sources.append(read_dotenv(f))
        except (OSError, ValueError) as e:    # an unreadable file must not stop the scrubber; say so
            print(f"warning: secrets of {f} cannot be read to scrub saved notebooks ({e})", file=sys.stderr)
    try:
        key_envs = {str(p.options["api_key_env"]) for p in presets("chat").values() if p.options.get("api_key_env")}
    except Exception:  # a broken preset file must not stop the scrubber
        key_envs = set()
    found = set()
    for env in sources:
        names = {k for k in env if SECRET_ENV.search(k)}
        names |= {k for k in env if any(k == e or re.fullmatch(rf"{re.escape(e)}_\d+", k) for e in key_envs)}
        found |= {env[k] for k in names if env.get(k) and len(env[k]) >= 8}
    return sorted(found, key=len, reverse=True)


def _scrub_strings(value, replacements: list[tuple[str, str]], secrets: list[str]):
    """Apply the replacements, redact secrets and absolute paths in every string of an output."""
    if isinstance(value, str):
        for old, new in replacements:
            value = value.replace(old, new)
        for secret in secrets:
            value = value.replace(secret, "***")
        return ABS_PATH.sub("<abs>/", value)
    if isinstance(value, list):
        return [_scrub_strings(v, replacements, secrets) for v in value]
    if isinstance(value, dict):
        return {k: (v if k in ("image/png", "image/jpeg") else _scrub_strings(v, replacements, secrets))
                for k, v in value.items()}
    return value
_TQDM = re.compile(r"(\d+it/s|s/it|it/s\]|\|[#█▏▎▍▌▋▊▉ ]+\|)")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("MPLBACKEND", "Agg")
    env.setdefault("PYTHONHASHSEED", "0")
    return env


def scrub_notebook(path: Path, output_path: Path | None = None) -> None:
    """Remove run-to-run churn and machine details from a saved notebook, in place."""
    import nbformat
    nb = nbformat.read(str(path), as_version=4)
    pm = nb.metadata.get("papermill", {})
    for k in ("start_time", "end_time", "duration", "environment_variables", "exception"):
        pm.pop(k, None)
    if output_path is not None:
        pm["output_path"] = str(output_path)
    for k in ("input_path", "output_path"):
        if k in pm and pm[k]:
            pm[k] = os.path.relpath(pm[k], ROOT) if os.path.isabs(pm[k]) else pm[k]
    secrets = loaded_secrets()
    replacements = [(str(ROOT) + "/", ""), (str(ROOT), "."), (os.path.expanduser("~") + "/", "~/")]
    for cell in nb.cells:
        if "injected-parameters" in cell.metadata.get("tags", []):
            cell["id"] = "injected-parameters"  # papermill draws a random id on every run
        cell.metadata.pop("papermill", None)
        cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        kept = []
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stderr" and (
                    _TQDM.search(out.get("text", "")) or not out.get("text", "").strip()):
                continue  # progress bars (and their blank leftovers): useful live, churn when saved
            kept.append(nbformat.from_dict(_scrub_strings(json.loads(json.dumps(out)), replacements, secrets)))
        cell.outputs = kept
    write_text(path, nbformat.writes(nb) + "\n")


class StageError(RuntimeError):
    """A stage failed; the message says which, where, and the error it raised."""


def run_notebook(stage: Stage, profile: str, params: dict) -> Path:
    import papermill as pm
    assert stage.notebook is not None
    src = stage.notebook
    if profile == "embedded":
        out = src
    else:
        out = ROOT / "artifacts" / profile / "notebooks" / src.name
        out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.stem}.running.ipynb")
    parameters = {"profile": profile, **params}
    try:
        pm.execute_notebook(os.path.relpath(src, ROOT), os.path.relpath(tmp, ROOT), parameters=parameters,
                            cwd=str(src.parent), kernel_name="python3", progress_bar=True,
                            report_mode=False, request_save_on_cell_execute=False)
    except pm.PapermillExecutionError as e:
        # keep the committed notebook; park the failed run where it can be inspected
        failed = ROOT / "artifacts" / profile / "notebooks" / f"FAILED_{src.name}"
        failed.parent.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            scrub_notebook(tmp, output_path=failed.relative_to(ROOT))
            os.replace(tmp, failed)
        raise StageError(f"{stage.label} failed (profile {profile}) in cell {e.exec_count}:\n"
                         f"{e.ename}: {e.evalue}\n(executed notebook: {failed.relative_to(ROOT)})") from None
    finally:
        if tmp.exists() and sys.exc_info()[0] is not None:
            tmp.unlink()
    scrub_notebook(tmp, output_path=out.relative_to(ROOT))
    os.replace(tmp, out)  # the executed notebook replaces the old one only when it ran through
    return out


def run_module(stage: Stage, profile: str) -> None:
    cmd = [sys.executable, "-m", stage.module, "--profile", profile]
    print(">>", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, cwd=ROOT, env=_env(), check=True)


@contextlib.contextmanager
def profile_services(profile: str):
    """What a profile's preset overlay (params/presets/overlays/<profile>.yaml) declares, for the
    stages' duration: the overlay itself (in the environment every stage inherits), a `prepare`
    module run first (the paper-smoke profile's checkpoints and datasets) and a loopback
    OpenAI-compatible server on `loopback_port` (0: a free one), whose URL replaces "{loopback}" in
    the overlay's base_urls. A profile without an overlay gets nothing."""
    path = overlay_path(profile)
    if not path.exists():
        yield
        return
    spec = read_overlay(path)
    if spec.get("prepare"):
        cmd = [sys.executable, "-m", *(resolve_model_path(str(a)) for a in spec["prepare"])]
        print(">>", " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, cwd=ROOT, env=_env(), check=True)
    env = {OVERLAY_ENV: str(path)}
    srv = None
    if "loopback_port" in spec:                      # 0: a free port (two runs on one machine never collide)
        srv = loopback.start(int(spec["loopback_port"] or 0))
        env[loopback.LOOPBACK_ENV] = f"http://127.0.0.1:{srv.server_address[1]}/v1"
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        if srv is not None:
            srv.shutdown()
            srv.server_close()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def reproduce(profile: str, only: str | None) -> int:
    try:
        chosen = select_stages(only)
        sections = validate_profile(profile, only=None)
    except ProfileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    os.environ.update({k: v for k, v in _env().items() if k not in os.environ})
    with profile_services(profile):
        return _run_stages(chosen, profile, sections)


def _run_stages(chosen: list[Stage], profile: str, sections: dict[str, dict[str, Any]]) -> int:
    for st in chosen:
        t0 = time.time()
        print(f"== {st.name} ({st.label}, profile {profile})", flush=True)
        try:
            if st.notebook is not None:
                run_notebook(st, profile, sections[st.name])
            else:
                run_module(st, profile)
        except (StageError, subprocess.CalledProcessError) as e:
            print(f"\nerror: {e}", file=sys.stderr)
            return 1
        print(f"== {st.name} done in {time.time() - t0:.0f}s", flush=True)
    if profile in README_PROFILES:      # the README's results table; a smoke run must not rewrite it
        update_readme(ROOT / "README.md")
    return 0


def _junit_counts(path: Path) -> tuple[int, int, int]:
    """(passed, failed, skipped) from a pytest junit-xml report."""
    if not path.exists():
        return 0, 0, 0
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    tests = sum(int(s.get("tests", 0)) for s in suites)
    failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    return tests - failed - skipped, failed, skipped


def test(skip_unit: bool = False) -> int:
    """pytest (unit), then the embedded stages under nbval, then artifact checks.

    Ends with one line `summary: N passed, N failed, N skipped` over all steps.
    """
    with tempfile.TemporaryDirectory(prefix="compendium-test-") as tmp:
        return _run_test_steps(Path(tmp), skip_unit)


def _run_test_steps(report_dir: Path, skip_unit: bool) -> int:
    env = _env()
    py = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    steps: list[tuple[str, list[str]]] = []
    if not skip_unit:
        steps.append(("unit tests", py + ["tests", "-m", "not artifacts and not gpu"]))
    try:
        for profile in ("embedded", "paper", SMOKE_PROFILE):
            validate_profile(profile)
    except ProfileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for st in select_stages(None):
        if st.notebook is not None:
            steps.append((f"nbval {st.notebook.name}",
                          py + ["--nbval-lax", "--nbval-current-env", "--nbval-cell-timeout=1500",
                                str(st.notebook.relative_to(ROOT))]))
        else:
            steps.append((f"stage {st.name}", [sys.executable, "-m", st.module, "--profile", "embedded"]))
    # the paper profile's code end to end on tiny stand-ins (params/paper-smoke.yaml): a first GPU run's plumbing
    steps.append((f"profile {SMOKE_PROFILE}", [sys.executable, "-m", "lib.runner", "reproduce", "--profile", SMOKE_PROFILE]))
    steps.append(("artifact checks", py + ["tests", "-m", "artifacts"]))
    timings = []
    totals = [0, 0, 0]
    rc = 0
    for i, (name, cmd) in enumerate(steps):
        print(f"\n=== {name}", flush=True)
        t0 = time.time()
        xml = report_dir / f"step{i}.xml"
        if cmd[1:3] == ["-m", "pytest"]:
            cmd = cmd + [f"--junitxml={xml}"]
        rc = subprocess.run(cmd, cwd=ROOT, env=env).returncode
        timings.append((name, time.time() - t0))
        for k, v in enumerate(_junit_counts(xml)):
            totals[k] += v
        if rc == 5 and name == "artifact checks":
            rc = 0  # no artifact tests selected is not a failure of the pipeline
        if rc != 0:
            print(f"\nFAILED: {name} (exit {rc})", file=sys.stderr)
            totals[1] = max(totals[1], 1)
            break
    print("\n=== timings")
    for name, dt in timings:
        print(f"  {dt:7.1f}s  {name}")
    print(f"summary: {totals[0]} passed, {totals[1]} failed, {totals[2]} skipped")
    return rc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("reproduce")
    r.add_argument("--profile", default="embedded")
    r.add_argument("--only", default=None, help="stage(s): number prefix or stem, comma-separated")
    t = sub.add_parser("test")
    t.add_argument("--skip-unit", action="store_true")
    args = ap.parse_args(argv)
    if args.cmd == "reproduce":
        return reproduce(args.profile, args.only)
    return test(args.skip_unit)


if __name__ == "__main__":
    raise SystemExit(main())
