"""The command line of `make reproduce`, `make test` and `make test-answers`, and `make test` itself.

    python -m lib.compendium.runner reproduce --profile embedded [--only 03] [--force] [--cold]
    python -m lib.compendium.runner test [--skip-unit]
    python -m lib.compendium.runner answers --profile ci

`make test` runs the unit tests, the ci profile's run of every notebook with its checks and its
kill-and-resume tests, paper-smoke, and the committed results' checks, in two lanes that share the
cores, records what ran, how long it took and how many model answers were replayed, and checks that
it left the working tree as it found it. The stages themselves run in `lib.compendium.stages`.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from lib import ROOT
from lib.compendium import results
from lib.compendium.artifacts import ARTIFACTS_ROOT, RESULTS_ROOT, cli_error, PUBLISHED_PROFILES, read_json, relpath, write_json
from lib.compendium.params import ProfileError, profile_path, validate_profile
from lib.compendium.presets import SHARED_CPU
from lib.compendium.procs import RUN_IDS_ENV, Stopped, end_processes, new_id, owned_run
from lib.compendium.stages import SMOKE_PROFILE, run_env, recorded_answers, export_answers, reproduce


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


#: the profile `make test` runs every notebook under: the embedded profile at test sizes (params/ci.yaml)
CI_PROFILE = "ci"


def test(skip_unit: bool = False, record: Path | None = None, cold: bool = False) -> int:
    """`make test`: the code is checked, the experiment is not rerun (that is `make reproduce`).

    Steps: the checks of the committed results (results/embedded/: metrics recomputed from their
    per-item files, figures, saved notebooks and README generated from them, every number a reading
    quotes backed by an output), the unit tests, every stage under the ci profile (papermill; each
    notebook's own assertions run), the checks of what that run wrote, the paper profile's code on
    stand-ins (paper-smoke), and a check that the working tree is as it was. Ends with one line
    `summary: N passed, N failed, N skipped`.

    The ci and paper-smoke runs replay their committed answers (results/<profile>/cache/, written by `make
    test-answers`) as `make reproduce` replays the embedded ones: the code around every model call runs, the
    served model generates only what a changed prompt or model asks anew (the serving stage and the unit
    tests still generate). `cold`: the ci run asks every model afresh."""
    with tempfile.TemporaryDirectory(prefix="compendium-test-") as tmp:
        return _run_test_steps(Path(tmp), skip_unit, record, cold)


#: what a lane that shares the cores sets: OpenMP threads (torch) and llama.cpp's threads sleep when idle
#: instead of spinning, so two processes with 2 threads each on 2 cores do not starve each other
SHARED_CPU_ENV = {"OMP_WAIT_POLICY": "PASSIVE", SHARED_CPU: "1"}


Command = tuple[str, list[str]]          # (name, argv)


#: a step of `make test` may take this many times its recorded time (results/make_test.json), never under the
#: floor; a step with no record gets the floor times the multiple
STEP_TIMEOUT_MULTIPLE = 3.0
STEP_TIMEOUT_FLOOR_S = 1200.0


def step_timeout(name: str) -> tuple[float, str]:
    """(seconds, why) a step of `make test` may take before it is ended as hung."""
    try:
        rec = float(read_json(RESULTS_ROOT / "make_test.json")["steps"][name])
    except (OSError, ValueError, KeyError, TypeError):
        rec = None
    if rec is None:
        return STEP_TIMEOUT_MULTIPLE * STEP_TIMEOUT_FLOOR_S, "no recorded time"
    s = max(STEP_TIMEOUT_FLOOR_S, STEP_TIMEOUT_MULTIPLE * rec)
    return s, f"{STEP_TIMEOUT_MULTIPLE:g} x its recorded {rec:.0f} s (results/make_test.json), floor {STEP_TIMEOUT_FLOOR_S:.0f} s"


def _run_command(name: str, cmd: list[str], env: dict[str, str], xml: Path, out=None) -> tuple[str, float, int]:
    """One step, every process it starts marked as its own: past its timeout (`step_timeout`) they are all
    ended and the step fails with 124, its error naming the step and the time."""
    if cmd[1:3] == ["-m", "pytest"]:
        cmd = cmd + [f"--junitxml={xml}"]
    timeout, why = step_timeout(name)
    step_id = new_id("step")
    env = dict(env)
    env[RUN_IDS_ENV] = f"{env[RUN_IDS_ENV]}:{step_id}" if env.get(RUN_IDS_ENV) else step_id
    t0 = time.time()
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT if out else None)
    try:
        rc = p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        end_processes(step_id)
        p.wait()
        rc = 124
        print(f"\nerror: make test's step '{name}' ran past its timeout of {timeout:.0f} s ({why}); every process "
              f"it started was ended", file=sys.stderr if out is None else out, flush=True)
    finally:
        end_processes(step_id)
    return name, time.time() - t0, rc


def _run_lanes(lanes: list[list[Command]], env: dict[str, str], report_dir: Path, tag: str
               ) -> tuple[int, list[tuple[str, float, int]], list[Path]]:
    """Run lanes side by side, each a sequence of commands that stops at its first failure. The first lane
    prints live; each other lane writes to a log (artifacts/test-logs/) whose stage lines, and the last 60
    lines of a failed command, are printed when the lane ends. Returns the first non-zero exit code (0 when
    every command passed), each command's (name, seconds, exit code) and the junit files written."""
    logs = ARTIFACTS_ROOT / "test-logs"
    logs.mkdir(parents=True, exist_ok=True)
    lane_env = {**env, **SHARED_CPU_ENV}
    rows: dict[tuple[int, int], tuple[str, float, int]] = {}
    xmls: list[Path] = []

    def lane(k: int, commands: list[Command]) -> None:
        log = logs / f"{tag}_lane{k}.log"
        out = None if k == 0 else log.open("w", encoding="utf-8")
        try:
            for m, (name, cmd) in enumerate(commands):
                xml = report_dir / f"{tag}_{k}_{m}.xml"
                xmls.append(xml)
                if out is not None:
                    out.write(f"\n=== {name}\n")
                    out.flush()
                rows[k, m] = _run_command(name, cmd, lane_env, xml, out)
                if rows[k, m][2]:
                    break
        finally:
            if out is not None:
                out.close()
                lines = log.read_text(encoding="utf-8", errors="replace").replace("\r", "\n").splitlines()
                shown = [ln for ln in lines if ln.startswith(("=== ", "== ")) or " passed" in ln or "done in" in ln]
                failed = any(rows.get((k, m), ("", 0, 0))[2] for m in range(len(commands)))
                print(f"\n--- lane {k + 1} ({', '.join(n for n, _ in commands)}) ran beside the above; its log: "
                      f"{relpath(log)}\n" + "\n".join(shown + (["..."] + lines[-60:] if failed else [])), flush=True)

    threads = [threading.Thread(target=lane, args=(k, c)) for k, c in enumerate(lanes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ordered = [rows[key] for key in sorted(rows)]
    return next((code for _, _, code in ordered if code), 0), ordered, xmls


def _git_status() -> str | None:
    try:
        r = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout if r.returncode == 0 else None


def _venv_seconds() -> float | None:
    """How long creating .venv took: from its pyvenv.cfg to the stamp the Makefile writes when the install ends."""
    cfg, stamp = ROOT / ".venv" / "pyvenv.cfg", ROOT / ".venv" / ".stamp"
    return stamp.stat().st_mtime - cfg.stat().st_mtime if cfg.exists() and stamp.exists() else None


def make_test_commands(py: list[str], skip_unit: bool = False, cold: bool = False) -> list[list[Command]]:
    """make test's commands, two lanes side by side. One: the ci run from nothing (its folder is scratch,
    the committed ci answers replayed unless `cold`), then its training stage and an LLM stage killed at
    random points and resumed (they must end with the same results), then the checks of what it wrote.
    Two: the unit tests, paper-smoke, then the checks of the committed results (the first lane is still the
    longer one on 2 cores; results/make_test.json has the measured steps)."""
    first: Command = ("committed results", py + ["tests", "-m", "results"])
    ci_run: Command = (f"profile {CI_PROFILE} (every stage at test sizes)",
                       [sys.executable, "-m", "lib.compendium.runner", "reproduce", "--profile", CI_PROFILE, "--force", "--fresh"]
                       + (["--cold"] if cold else []))
    unit: Command = ("unit tests", py + ["tests", "--durations=15", "-m",
                                         "not results and not ci_run and not gpu"])
    smoke: Command = (f"profile {SMOKE_PROFILE}", [sys.executable, "-m", "lib.compendium.runner", "reproduce", "--profile",
                                                   SMOKE_PROFILE])
    resume: Command = (f"{CI_PROFILE} stages killed and resumed", py + ["tests", "-m", "ci_resume"])
    last: Command = (f"checks of the {CI_PROFILE} run", py + ["tests", "-m", "ci_run and not ci_resume"])
    return [[ci_run, resume, last], ([] if skip_unit else [unit]) + [smoke, first]]


def _run_test_steps(report_dir: Path, skip_unit: bool, record: Path | None = None, cold: bool = False) -> int:
    t_start = time.time()
    env = run_env()
    py = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    try:
        for profile in ("embedded", "paper", SMOKE_PROFILE, CI_PROFILE):
            validate_profile(profile)
    except ProfileError as e:
        return cli_error(e)
    status_before = _git_status()
    # two lanes side by side: every stage at test sizes from nothing (the ci run's own folder is wiped first: it
    # is scratch), and beside it the unit tests and the paper profile's code end to end on tiny stand-ins
    # (params/paper-smoke.yaml: a first GPU run's plumbing). No lane keeps both cores busy all the time (notebook start-up, imports, single-threaded
    # Python, a server waiting for its client), so side by side they take several minutes less on 2 cores
    # than one after the other. The ci lane ends with the checks of what the ci run wrote, the other with the
    # checks of the committed results.
    lanes = make_test_commands(py, skip_unit, cold)
    timings: list[tuple[str, float, int]] = []
    totals = [0, 0, 0]
    rc = 0
    xmls: list[Path] = []
    for k, step in enumerate([lanes]):
        print("\n=== side by side: " + " | ".join(", ".join(n for n, _ in ln) for ln in step), flush=True)
        rc, rows, files = _run_lanes(step, env, report_dir, f"step{k}")
        xmls += files
        timings += rows
        failed = next((name for name, _, code in rows if code), None)
        if failed:
            print(f"\nFAILED: {failed} (exit {rc})", file=sys.stderr)
            break
    for xml in xmls:
        for k, v in enumerate(_junit_counts(xml)):
            totals[k] += v
    if rc:
        totals[1] = max(totals[1], 1)
    if rc == 0 and status_before is not None:
        after = _git_status()
        if after != status_before:
            changed = sorted(set((after or "").splitlines()) - set(status_before.splitlines()))
            print(f"\nFAILED: make test changed the working tree ({len(changed)} paths):\n  " + "\n  ".join(changed[:20]),
                  file=sys.stderr)
            totals[1] += 1
            rc = 1
        else:
            print("\nthe working tree is as it was (git status unchanged)")
            totals[0] += 1
    wall = time.time() - t_start
    print("\n=== timings")
    for name, dt, _ in timings:
        print(f"  {dt:7.1f}s  {name}")
    print(f"  {wall:7.1f}s  total (wall; the side-by-side steps overlap)")
    answers = {p: a for p in (CI_PROFILE, SMOKE_PROFILE) if (a := recorded_answers(p))}
    for p, a in answers.items():
        print(f"the {p} run asked the models for {a['asked']} answers and loaded {a['loaded']} committed ones"
              + (" (`make test-answers` commits the new ones: later runs replay them)" if a["asked"] else ""))
    print(f"summary: {totals[0]} passed, {totals[1]} failed, {totals[2]} skipped")
    if record is not None and rc == 0:       # make test's measured record (results/make_test.json once copied back)
        venv = _venv_seconds() or 0.0
        rev = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        write_json(record, {"machine": results.machine_description(), "commit": rev.stdout.strip(),
                            "total_s": round(wall + venv, 1), "venv_s": round(venv, 1),
                            "steps": {name: round(dt, 1) for name, dt, _ in timings},
                            "side_by_side": [" then ".join(n for n, _ in ln) for ln in lanes],
                            "passed": totals[0], **({"answers": answers} if answers else {})})
        print(f"record: {record}")
    return rc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("reproduce")
    r.add_argument("--profile", default="embedded")
    r.add_argument("--only", default=None, help="stage(s): number prefix or stem, comma-separated")
    r.add_argument("--force", action="store_true", help="run every chosen stage, even one that is up to date")
    r.add_argument("--cold", action="store_true", help="ask every model afresh (the old answers are kept aside)")
    r.add_argument("--fresh", action="store_true", help="delete artifacts/<profile>/ first (not for a published "
                                                         "profile: its trained models and answers are hours of work)")
    r.add_argument("--no-publish", action="store_true", help="do not copy the results to results/<profile>/")
    r.add_argument("--deps", action="store_true", help="regenerate first what the chosen stages read and nothing "
                                                        "here or committed holds (make reproduce NB=06 DEPS=1)")
    a = sub.add_parser("answers", help="export the model answers a profile's last run used to results/<profile>/cache/")
    a.add_argument("--profile", default=CI_PROFILE)
    a.add_argument("--keep", action="store_true", help="keep the committed answers beside the new ones (a CPU of "
                                                       "another kind trains other weights and asks other keys)")
    t = sub.add_parser("test")
    t.add_argument("--skip-unit", action="store_true")
    t.add_argument("--cold", action="store_true", help="the ci run asks every model afresh instead of replaying "
                                                       "the committed ci answers")
    t.add_argument("--record", type=Path, default=None, help="write the measured record (steps, times, machine) here")
    args = ap.parse_args(argv)
    what = f"runner {args.cmd}" + (f" --profile {args.profile}" if getattr(args, "profile", None) else "")
    try:
        with owned_run(what):      # every process the run starts ends with it (lib.compendium.procs)
            return _main(args)
    except KeyboardInterrupt:
        print("\nstopped (SIGINT): every process the run started was ended; `make reproduce` resumes where it stopped",
              file=sys.stderr)
        return 130
    except Stopped as e:
        print(f"\nstopped (signal {int(e.code) - 128}): every process the run started was ended; `make reproduce` "
              f"resumes where it stopped", file=sys.stderr)
        return int(e.code)


def _main(args: argparse.Namespace) -> int:
    if args.cmd == "reproduce":
        if args.fresh:
            try:
                profile_path(args.profile)            # a plain name: nothing outside artifacts/ is removed
            except ProfileError as e:
                return cli_error(e)
            if args.profile in PUBLISHED_PROFILES:
                print(f"error: --fresh would delete artifacts/{args.profile}/ (a published profile's models, caches "
                      f"and runs); use `make clean-artifacts PROFILE={args.profile}` if you mean it", file=sys.stderr)
                return 2
            shutil.rmtree(ARTIFACTS_ROOT / args.profile, ignore_errors=True)
        return reproduce(args.profile, args.only, force=args.force, cold=args.cold,
                         publish=False if args.no_publish else None, deps=args.deps)
    if args.cmd == "answers":
        try:
            profile_path(args.profile)
        except ProfileError as e:
            return cli_error(e)
        return export_answers(args.profile, keep=args.keep)
    return test(args.skip_unit, args.record, cold=args.cold)


if __name__ == "__main__":
    raise SystemExit(main())
