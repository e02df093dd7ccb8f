"""`make reproduce`: each stage of a profile run by papermill (a notebook) or as a module, skipped while
its stamp (the code, its notebook, its parameters) is unchanged, resumable after a kill, with its time
and an estimate of the rest; saved notebooks scrubbed of timestamps, absolute paths, progress bars and
anything that looks like a secret; the model answers a run loaded and asked for, recorded and exported.
Embedded-profile notebooks are executed in place, so the committed notebooks carry the embedded run's
outputs; other profiles write theirs under `artifacts/<profile>/notebooks/`.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from lib import ROOT
from lib.compendium import numerics, results
from lib.compendium.bookkeeping import differs_in_times_only
from lib.compendium.artifacts import (ARTIFACTS_ROOT, cli_error, PUBLISHED_PROFILES, read_json, relpath, write_bytes,
                                      write_json)
from lib.models.chat import loopback
from lib.models.chat.cache import STAGE_ENV, CacheError, ResponseCache, default_cache_path, read_exported
from lib.compendium.params import (ProfileError, Stage, ancestors, runner_config, section_digest, select_stages,
                                   stages, validate_profile)
from lib.compendium.presets import OVERLAY_ENV, nearest_overlay, read_overlay, resolve_model_path
from lib.compendium.results import README_PROFILES, update_readme
from lib.compendium.execution import (CellTimeout, Limits, NbvalFailure, cell_text, execute_nbval, execute_papermill,
                                      executor_for, stage_limits)
from lib.compendium.procs import end_processes, new_id, tagged
from lib.compendium.scrub import ABS_PATH, loaded_secrets, scrub_notebook  # noqa: F401  (stages.scrub_notebook as before)
from lib.compendium.stamps import (Digests, changed_during, current_stamps, notebook_code, stage_stamp, stamp_file,
                                   up_to_date)
from lib.compendium.usage import USAGE_ENV, collect
from lib.compendium.inputs import NEEDS, drop_taken, plan, take_from_parent, take_from_results, taken
from lib.compendium.outputs import OutputsMissing, check_outputs
from lib.compendium.timekeeping import (ESTIMATE_SOURCES, _minutes, _slowest_cell, estimates,  # noqa: F401
                                        record_timing, time_left)


#: the profile `make test` runs after the embedded stages: the paper profile on tiny stand-ins
SMOKE_PROFILE = "paper-smoke"


def run_env(profile: str | None = None) -> dict[str, str]:
    """The environment of a stage's processes: the pinned CPU numerics (`numerics`; native for the paper profile
    on a GPU machine, `numerics.mode_for`), offline hubs, fixed hash seed, no GUI backend."""
    env = numerics.pinned_env()                           # every kernel starts with the pinned CPU numerics
    if profile is not None and numerics.mode_for([profile, *ancestors(profile)]) == "native":
        env[numerics.MODE_ENV] = "native"
        for k in numerics.SET_HERE:                       # what `import lib` pinned here, not the user's own
            env.pop(k, None)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("MPLBACKEND", "Agg")
    env.setdefault("PYTHONHASHSEED", "0")
    return env


class StageError(RuntimeError):
    """A stage failed; the message says which, where, and the error it raised."""


class StageTimeout(StageError):
    """A stage ran past its stage timeout: the message names it, the cell it was in and the limit."""


def run_notebook(stage: Stage, profile: str, params: dict, limits: Limits | None = None,
                 executor: str = "papermill", check: Callable[[], None] | None = None, in_place: bool = True) -> Path:
    """Execute a stage's notebook (papermill, or nbval for a profile whose runner says so), each cell under
    `limits.cell_s`; the executed notebook replaces the saved one only when it ran through and `check` (the
    stage's outputs, lib.compendium.outputs.check_outputs) passed. A failure is a StageError naming the notebook,
    the cell and the error (the failed run parked under artifacts/<profile>/notebooks/FAILED_<name>). `in_place`
    (the embedded profile): the committed notebook is the one rewritten; a run that only provides another stage's
    inputs writes its copy under artifacts/<profile>/notebooks/ instead."""
    assert stage.notebook is not None
    limits = limits or Limits(24 * 3600.0, 24 * 3600.0, "no limit given", "no limit given")
    src = stage.notebook
    if profile == "embedded" and in_place:
        out = src
    else:
        out = ROOT / "artifacts" / profile / "notebooks" / src.name
        out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.stem}.running.ipynb")
    parameters = {"profile": profile, **params}
    try:
        if executor == "nbval":
            execute_nbval(src, tmp, parameters, limits, ARTIFACTS_ROOT / profile / "notebooks")
        else:
            execute_papermill(src, tmp, parameters, limits)
        if check is not None:
            check()
    except Exception as e:  # noqa: BLE001 - every failure of the notebook: named, the saved notebook kept
        # keep the committed notebook; park the failed run where it can be inspected
        failed = ROOT / "artifacts" / profile / "notebooks" / f"FAILED_{src.name}"
        failed.parent.mkdir(parents=True, exist_ok=True)
        where = None
        if tmp.exists():
            where = cell_text(tmp)
            scrub_notebook(tmp, output_path=failed.relative_to(ROOT))
            os.replace(tmp, failed)
        raise StageError(_failure_text(stage, profile, e, where, failed)) from None
    finally:
        if tmp.exists() and sys.exc_info()[0] is not None:
            tmp.unlink()
    write_cell_timings(tmp, ARTIFACTS_ROOT / profile / "notebooks" / f"{src.stem}.cells.json")
    scrub_notebook(tmp, output_path=out.relative_to(ROOT))
    os.replace(tmp, out)  # the executed notebook replaces the old one only when it ran through
    return out


def _failure_text(stage: Stage, profile: str, e: Exception, where: str | None, failed: Path) -> str:
    import papermill as pm
    if isinstance(e, pm.PapermillExecutionError):
        return (f"{stage.label} failed (profile {profile}) in cell {e.exec_count}:\n{e.ename}: {e.evalue}\n"
                f"(executed notebook: {failed.relative_to(ROOT)})")
    if isinstance(e, (CellTimeout, NbvalFailure, OutputsMissing)):
        return f"{stage.label} (profile {profile}): {e}\n(executed notebook: {failed.relative_to(ROOT)})"
    return (f"{stage.label} failed (profile {profile}) in {where or 'a cell'}: {type(e).__name__}: {e}\n"
            f"(executed notebook: {failed.relative_to(ROOT)})")


def write_cell_timings(executed: Path, dest: Path, min_s: float = 0.5) -> list[dict[str, Any]]:
    """Where a stage's time went: the seconds of each code cell that took at least `min_s`, slowest first,
    with the cell's first line (papermill's per-cell durations, which the saved notebook does not keep)."""
    import nbformat
    nb = nbformat.read(str(executed), as_version=4)
    rows = []
    for i, cell in enumerate(nb.cells):
        d = cell.metadata.get("papermill", {}).get("duration")
        if cell.cell_type == "code" and d is not None and d >= min_s:
            first = next((ln for ln in cell.source.splitlines() if ln.strip() and not ln.lstrip().startswith("#")), "")
            rows.append({"cell": i, "seconds": round(float(d), 1), "code": first[:100]})
    rows.sort(key=lambda r: -r["seconds"])
    write_json(dest, {"notebook": executed.name.removeprefix(".").replace(".running", ""), "cells": rows})
    return rows


def run_module(stage: Stage, profile: str, limits: Limits | None = None) -> None:
    """A python step in a process of its own, under its stage's timeout (`limits.stage_s`)."""
    cmd = [sys.executable, "-m", stage.module, "--profile", profile]
    print(">>", " ".join(cmd[1:]), flush=True)
    timeout = limits.stage_s if limits is not None else None
    try:
        subprocess.run(cmd, cwd=ROOT, env=run_env(profile), check=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise StageTimeout(f"{stage.label} (profile {profile}) ran past its timeout of {timeout:.0f} s "
                           f"({limits.stage_why}); every process it started was ended") from None
    except subprocess.CalledProcessError as e:
        raise StageError(f"{stage.label} (profile {profile}) exited with status {e.returncode}") from None


#: a profile's `prepare` module (the paper-smoke stand-ins: about a minute) may take at most this long
PREPARE_TIMEOUT_S = 1800


@contextlib.contextmanager
def profile_services(profile: str):
    """What a profile's preset overlay (params/presets/overlays/<profile>.yaml) declares, for the
    stages' duration: the overlay itself (in the environment every stage inherits), a `prepare`
    module run first (the paper-smoke profile's checkpoints and datasets) and a loopback
    OpenAI-compatible server on `loopback_port` (0: a free one), whose URL replaces "{loopback}" in
    the overlay's base_urls. A profile without an overlay gets nothing."""
    path = nearest_overlay(profile, ancestors(profile))
    if not path.exists():
        yield
        return
    spec = read_overlay(path)
    if spec.get("prepare"):
        cmd = [sys.executable, "-m", *(resolve_model_path(str(a)) for a in spec["prepare"])]
        print(">>", " ".join(cmd[1:]), flush=True)
        try:
            subprocess.run(cmd, cwd=ROOT, env=run_env(profile), check=True, timeout=PREPARE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise StageError(f"the prepare step of profile {profile} ({' '.join(cmd[2:])}) ran past its timeout of "
                             f"{PREPARE_TIMEOUT_S} s") from None
        except subprocess.CalledProcessError as e:
            raise StageError(f"the prepare step of profile {profile} ({' '.join(cmd[2:])}) exited with status "
                             f"{e.returncode}") from None
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


def reproduce(profile: str, only: str | None, force: bool = False, cold: bool = False,
              publish: bool | None = None, deps: bool = False) -> int:
    """Run the chosen stages of a profile (all by default), in order. A stage is skipped as up to date
    while nothing its last run used has changed (its parameters, its notebook's code, the library modules,
    prompt files and other stages' outputs its processes used: lib.compendium.stamps), so a run killed at any point
    resumes at the stage it stopped in (whose own caches - trained runs, model answers - make the
    finished part cheap). `force`: run every chosen stage. `cold`: ask every model afresh (the
    response cache is moved aside, kept, and no committed answer is loaded; implies `force`).
    Otherwise a published profile first loads the committed answers (results/<profile>/cache/) that
    its cache lacks, so a fresh clone replays them. `publish` (default: a published profile) copies
    each finished stage's results to results/<profile>/ after comparing them with the committed ones.
    Stages chosen alone get their inputs first (`provide_inputs`): committed results copied, and with `deps`
    (DEPS=1) what is not committed regenerated; without it, a run that needs regenerating stops before anything
    runs and says what and how long."""
    try:
        chosen = select_stages(only)
        sections = validate_profile(profile, only=None)
    except ProfileError as e:
        return cli_error(e)
    stage_env = run_env(profile)
    os.environ.update({k: v for k, v in stage_env.items() if k not in os.environ})
    if stage_env.get(numerics.MODE_ENV) == "native":      # the paper profile on a GPU machine: nothing pinned
        os.environ[numerics.MODE_ENV] = "native"
        for k in numerics.SET_HERE:
            os.environ.pop(k, None)
    publish = profile in PUBLISHED_PROFILES if publish is None else publish
    committed = next((c for c in map(results.cache_export_path, [profile, *ancestors(profile)]) if c.exists()),
                     results.cache_export_path(profile))    # a child profile replays what its parent committed
    try:        # the committed answers are untrusted input: read whole and checked before anything runs or is written;
                # a COLD run never reads them (asking afresh is the way out of a damaged file)
        answers = (read_exported(committed) if not cold and (committed.exists() or committed.is_symlink()) else None)
    except CacheError as e:
        return cli_error(e)
    cache = default_cache_path(profile)
    if cold:
        force = True
        if cache.exists():
            aside = cache.with_name(f"responses.{time.strftime('%Y%m%dT%H%M%S')}.sqlite")
            for suffix in ("", "-wal", "-shm"):
                if Path(str(cache) + suffix).exists():
                    os.replace(str(cache) + suffix, str(aside) + suffix)
            print(f">> COLD: every model is asked afresh; the old answers are kept in {relpath(aside)}", flush=True)
    added = 0
    if not cold and answers is not None:
        added = ResponseCache(cache).import_rows(answers)
        if added:
            print(f">> loaded {added} committed model answers from {relpath(committed)} (COLD=1 asks afresh)",
                  flush=True)
    held = len(ResponseCache(cache)) if cache.exists() else 0
    try:
        with profile_services(profile):
            rc = provide_inputs(profile, chosen, sections, deps)
            if rc == 0:
                rc = _run_stages(chosen, profile, sections, force, publish, cold_run=cold,
                                 no_times={s.name for s in chosen} if _borrowed(profile, chosen) else set())
    except StageError as e:
        print(f"\nerror: {e}", file=sys.stderr)
        rc = 1
    record_answers(profile, loaded=added, asked=(len(ResponseCache(cache)) if cache.exists() else 0) - held,
                   every_stage=only is None)
    return rc


def provide_inputs(profile: str, chosen: list[Stage], sections: dict[str, dict[str, Any]], deps: bool) -> int:
    """What the chosen stages read of stages that have not run here (lib.compendium.inputs.plan): said first, with
    the measured time of what must be regenerated; committed results are copied at once; what is not committed
    (MemeWorld's files, trained models, the TRACE runs notebook 06 loads) is regenerated only with `deps`, else the
    run stops here (exit 2) naming it. Returns 0 when every input is there."""
    pl = plan(profile, [s.name for s in chosen], ARTIFACTS_ROOT, results.RESULTS_ROOT)
    if not (pl.copy or pl.run or pl.trace_runs or pl.inherit):
        return 0
    est = estimates(profile)
    names = ", ".join(s.name for s in chosen)
    print(f">> {names} reads what stages that have not run here wrote:", flush=True)
    if pl.copy:
        print(f"   taken from results/{profile}/ (the committed results, copied; never written back): "
              f"{', '.join(pl.copy)}", flush=True)
    if pl.inherit:
        print("   reused from the profile it extends, whose parameters for them it leaves as they are: "
              + ", ".join(f"{s} ({'results/' + par[:-8] if par.endswith(':results') else 'artifacts/' + par}/{s})"
                          for s, par in pl.inherit), flush=True)
    cost = sum(est[s][0] for s in pl.run if s in est)
    for s, par in pl.run_parent:
        e = estimates(par).get(s)
        cost += e[0] if e else 0.0
        print(f"   regenerated for profile {par} first (then reused): {s} "
              f"({e[1] + ' ' + _minutes(e[0]) if e else 'never timed'})", flush=True)
    if pl.run:
        print("   regenerated here first (not committed: "
              + ", ".join(f"{s} ({est[s][1]} {_minutes(est[s][0])})" if s in est else f"{s} (never timed)" for s in pl.run)
              + ")", flush=True)
    if pl.trace_runs:
        t = trace_retrain_seconds(profile, pl.trace_runs, sections)
        cost += t
        print(f"   {len(pl.trace_runs)} TRACE runs of 02_finetuning retrained from their committed configurations "
              f"(their weights are not committed): {', '.join(pl.trace_runs)} (about {_minutes(t)})", flush=True)
    if pl.run or pl.trace_runs or pl.run_parent:
        print(f"   about {_minutes(cost)} before {names} starts", flush=True)
        if not deps:
            first = " then ".join([f"make reproduce NB={s}" + (f" PROFILE={par}" if par != "embedded" else "")
                                   for s, par in pl.run_parent]
                                  + [f"make reproduce NB={s}" + (f" PROFILE={profile}" if profile != "embedded" else "")
                                     for s in pl.run]) or "make reproduce NB=02"
            needed = ([s for s, _ in pl.run_parent] + pl.run + (['02_finetuning (its TRACE runs)'] if pl.trace_runs else []))
            return cli_error(f"{names} needs what {', '.join(needed)} "
                             f"would write, which is neither in artifacts/{profile}/ nor committed: rerun with DEPS=1 "
                             f"(`make reproduce NB={chosen[0].name[:2]} DEPS=1`) to regenerate it here first, or run "
                             f"`{first}`")
    for s in pl.copy:
        n = len(take_from_results(profile, s, ARTIFACTS_ROOT, results.RESULTS_ROOT))
        print(f"   {s}: {n} files from results/{profile}/{s}/", flush=True)
    for par in dict.fromkeys(p for _, p in pl.run_parent):
        theirs = validate_profile(par)
        rc = _run_stages([st for st in stages() if (st.name, par) in pl.run_parent], par, theirs, publish=False,
                         in_place=False, no_times={s for s, q in pl.run_parent if q == par})
        if rc:
            return rc
    for s, par in pl.inherit:
        n = len(take_from_parent(profile, s, par, ARTIFACTS_ROOT, results.RESULTS_ROOT))
        print(f"   {s}: {n} files from {'results/' + par[:-8] if par.endswith(':results') else 'artifacts/' + par}/{s}/",
              flush=True)
    if pl.run:
        rc = _run_stages([st for st in stages() if st.name in pl.run], profile, sections, publish=False, in_place=False,
                         no_times=set(pl.run))
        if rc:
            return rc
    if pl.trace_runs:
        cmd = [sys.executable, "-m", "lib.trace.runs", "--profile", profile, "--retrain-committed", ",".join(pl.trace_runs)]
        print(">>", " ".join(cmd[1:]), flush=True)
        try:
            subprocess.run(cmd, cwd=ROOT, env=run_env(profile), check=True, timeout=max(3600.0, 4 * cost))
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
            return cli_error(f"retraining the TRACE runs {', '.join(pl.trace_runs)} failed ({e})")
    return 0


def _borrowed(profile: str, chosen: list[Stage]) -> bool:
    """Whether the chosen stages read anything this run took from the committed results or regenerated for them:
    their times are then no stage's time from nothing or from a fresh clone, and are not published."""
    return any(taken(profile, up, ARTIFACTS_ROOT) for st in chosen for up in NEEDS.get(st.name, {}))


def trace_retrain_seconds(profile: str, names: list[str], sections: dict[str, dict[str, Any]]) -> float:
    """The recorded training time of committed TRACE runs (their result.json), spread over notebook 02's workers."""
    total = 0.0
    for n in names:
        f = results.RESULTS_ROOT / profile / "02_finetuning" / "runs" / n / "result.json"
        try:
            total += float(read_json(f).get("seconds", 0.0)) if f.exists() else 0.0
        except (OSError, ValueError):
            pass
    return total / max(1, int(sections.get("02_finetuning", {}).get("train_workers", 1) or 1))


def record_answers(profile: str, loaded: int, asked: int, every_stage: bool = True) -> dict[str, int]:
    """After a run: how many model answers it loaded from the committed ones and how many it asked a model for
    (new entries in the response cache), printed and kept in artifacts/<profile>/timings.json: `answers` for
    a run of every stage, `answers_partial` for a run of some (NB=..), which must not hide the full run's.
    A run that replays committed answers asks none; one whose prompts or models changed asks for the rest."""
    rec = {"loaded": int(loaded), "asked": int(max(asked, 0))}
    timings_file = ARTIFACTS_ROOT / profile / "timings.json"
    if timings_file.parent.exists():
        key = "answers" if every_stage else "answers_partial"
        write_json(timings_file, {**(read_json(timings_file) if timings_file.exists() else {}), key: rec})
    print(f">> model answers: {rec['asked']} asked afresh in this run, {rec['loaded']} loaded from the committed "
          f"ones ({relpath(results.cache_export_path(profile))})", flush=True)
    return rec


def export_answers(profile: str, keep: bool = False) -> int:
    """`make test-answers` (after a run of that profile): write the answers its stages' last runs used to
    results/<profile>/cache/responses.jsonl.gz, which the next run of that profile replays. A published
    profile does this itself when it publishes; the ci and paper-smoke profiles' answers are what `make
    test` replays. `keep` (`make test-answers KEEP=1`): the committed answers stay beside the new ones, so a
    machine whose CPU trains other weights adds its own answers and both kinds replay."""
    cache = default_cache_path(profile)
    if not cache.exists():
        print(f"error: {relpath(cache)} does not exist: run `make reproduce PROFILE={profile}` first", file=sys.stderr)
        return 2
    out = results.cache_export_path(profile)
    n = ResponseCache(cache).export(out, keep=keep)
    print(f">> {n} model answers the stages of profile {profile} used -> {relpath(out)} "
          f"({out.stat().st_size / 2 ** 20:.2f} MB)")
    return 0


def _run_stages(chosen: list[Stage], profile: str, sections: dict[str, dict[str, Any]], force: bool = False,
                publish: bool = False, cold_run: bool = False, in_place: bool = True,
                no_times: set[str] | frozenset[str] = frozenset()) -> int:
    """Run the chosen stages in order (see `reproduce`). A stage publishes (`publish`) only once it ran through and
    wrote what it declares; `in_place`: the embedded profile's saved notebooks are the ones rewritten; `no_times`:
    stages whose times are no stage's from nothing or from a fresh clone (their inputs were borrowed)."""
    cfg = runner_config(sections)
    est = estimates(profile, cold=cold_run)
    timings_file = ARTIFACTS_ROOT / profile / "timings.json"
    timings = read_json(timings_file) if timings_file.exists() else {}
    digests = Digests()
    every = stages()
    stamps = current_stamps(every, sections, profile, digests, ARTIFACTS_ROOT)
    rows = []
    published: list[str] = []
    measured: dict[str, dict[str, Any]] = {}
    t_all = time.time()
    for k, st in enumerate(chosen, 1):
        if not force and up_to_date(profile, st, stamps[st.name], ARTIFACTS_ROOT):
            print(f"== [{k}/{len(chosen)}] {st.name}: up to date (nothing it used changed since it last ran; FORCE=1 "
                  f"reruns it)", flush=True)
            rows.append((st.name, 0.0, "up to date"))
            continue
        todo = [s.name for s in chosen[k - 1:] if force or not up_to_date(profile, s, stamps[s.name], ARTIFACTS_ROOT)]
        this = f"{est[st.name][1]} {_minutes(est[st.name][0])}" if st.name in est else "never timed"
        guess = f"; {this}; {time_left(todo, est)}"
        print(f"== [{k}/{len(chosen)}] {st.name} ({st.label}, profile {profile}{guess})", flush=True)
        stamp_file(profile, st, ARTIFACTS_ROOT).unlink(missing_ok=True)   # a stage that starts is not done until it finishes again
        # from nothing: every model is asked afresh (COLD=1), or the stage's folder (its trained runs, models,
        # agents) does not exist yet and every model answer it uses is asked in this run (checked when it ends)
        cache = default_cache_path(profile)
        if drop_taken(profile, st.name, ARTIFACTS_ROOT):      # it computes its own: never the committed ones read back
            folder = ARTIFACTS_ROOT / profile / st.name
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        fresh = not (ARTIFACTS_ROOT / profile / st.name).exists()
        cold = cold_run or fresh
        os.environ[STAGE_ENV] = st.name
        usage_dir = ARTIFACTS_ROOT / profile / ".usage" / st.name
        shutil.rmtree(usage_dir, ignore_errors=True)
        os.environ[USAGE_ENV] = str(usage_dir)            # every process of the stage records what it used
        held = 0
        if cache.exists():
            ResponseCache(cache).clear_used(st.name)
            held = len(ResponseCache(cache))
        t0 = time.time()
        code_before = notebook_code(st.notebook) if st.notebook is not None else None
        limits = stage_limits(profile, st.name, cfg)
        try:
            _run_one(st, profile, sections[st.name], limits, executor_for(profile, cfg.executor), in_place=in_place)
        except StageError as e:
            print(f"\nerror: {e}", file=sys.stderr)
            _print_timings(rows + [(st.name, time.time() - t0, "FAILED")], time.time() - t_all)
            return 1
        finally:
            os.environ.pop(STAGE_ENV, None)
            os.environ.pop(USAGE_ENV, None)
        dt = time.time() - t0
        if cold and not cold_run and cache.exists():
            used, asked = ResponseCache(cache).used_count(st.name), len(ResponseCache(cache)) - held
            cold = used <= asked          # answers reused from earlier runs: not a time from nothing
        if st.name in no_times:           # its inputs were borrowed: no time from nothing or from a fresh clone
            cold = fresh = False
        usage = collect(usage_dir, main=st.module)
        names = [s.name for s in every]
        prev = names[names.index(st.name) - 1] if names.index(st.name) else None
        moved = changed_during(st, usage, profile, t0)
        if st.notebook is not None and notebook_code(st.notebook) != code_before:
            moved.insert(0, str(st.notebook.relative_to(ROOT)))
        if moved:         # edited while it ran: its outputs are not the current code's; the next run reruns it
            stamp_file(profile, st, ARTIFACTS_ROOT).unlink(missing_ok=True)
            print(f"   {st.name}: {', '.join(moved[:5])} changed while it ran: no stamp written, the next run reruns it",
                  flush=True)
        else:
            stamp = stage_stamp(st, sections[st.name], profile, usage, stamps.get(prev, "") if prev else "", digests)
            write_json(stamp_file(profile, st, ARTIFACTS_ROOT), {"stamp": stamp, "usage": usage})
        stamps = current_stamps(every, sections, profile, digests, ARTIFACTS_ROOT)   # its outputs move later stamps
        write_json(timings_file, record_timing(timings, st.name, dt, cold, fresh, section_digest(sections[st.name]),
                                               slowest_cell_s=_slowest_cell(profile, st)))
        measured[st.name] = {"section": None if st.name in no_times else "stages" if cold else "replayed" if fresh
                             else None, "row": timings["last_run"][st.name]}
        rows.append((st.name, dt, "ran"))
        print(f"== {st.name} done in {_minutes(dt)}", flush=True)
        if publish:
            results.publish_stage(profile, st.name)
            kept = keep_committed(profile, st.name)
            if kept:
                print(f"   {st.name}: the committed {', '.join(kept[:5])} kept (only times moved); later stages read "
                      f"them, so the figures drawn from them are the ones the committed results give", flush=True)
                stamps = current_stamps(every, sections, profile, digests, ARTIFACTS_ROOT)   # its outputs moved
            published.append(st.name)
    if publish:       # some stages: keep the others' answers; only the published stages' times
        results.publish_run(profile, partial=len(chosen) < len(stages()), published=published, measured=measured)
        if profile in README_PROFILES:      # the README's results table; a smoke run must not rewrite it
            update_readme(ROOT / "README.md")
    _print_timings(rows, time.time() - t_all)
    return 0


def keep_committed(profile: str, stage: str) -> list[str]:
    """After publish_stage: where a result file's committed copy was kept because the run's copy differs only in
    times and rates, write the committed bytes over the run's copy in artifacts/, so the stages after it (07's
    figures: the serving throughput is drawn from times) read what is committed, and a fresh clone's
    `make reproduce NB=07`, which reads the committed copy, draws the same bytes. Only plain JSON, JSON-lines and CSV
    files without absolute paths whose other fields (cache keys and code digests included) are the run's: returns
    their names."""
    dest = results.results_dir(profile) / stage
    kept = []
    for rel, f in results.stage_result_files(profile, stage).items():
        committed = dest / rel
        if not committed.is_file():
            continue                                  # compressed when committed, or not published: left as it is
        data, mine = committed.read_bytes(), f.read_bytes()
        if (data != mine and results._scrubbed(f) == mine and results.same_result(committed, mine)
                and differs_in_times_only(rel, data, mine)):
            write_bytes(f, data)
            kept.append(rel)
    return kept


def _run_one(st: Stage, profile: str, params: dict[str, Any], limits: Limits, executor: str,
             in_place: bool = True) -> None:
    """One stage, every process it starts marked as the stage's (lib.compendium.procs): a watchdog ends them all
    when the stage runs past `limits.stage_s` (its error then says so, with the cell it was in), and whatever the
    stage leaves running when it ends, or fails, is ended with it."""
    stage_id = new_id("stage")
    expired = threading.Event()

    def watchdog() -> None:
        expired.set()
        end_processes(stage_id)
    timer = threading.Timer(limits.stage_s, watchdog)
    timer.daemon = True
    with tagged(stage_id):
        timer.start()
        try:
            since = time.time()
            check = (lambda: check_outputs(profile, st.name, ARTIFACTS_ROOT, since=since))
            if st.notebook is not None:
                run_notebook(st, profile, params, limits=limits, executor=executor, check=check, in_place=in_place)
            else:
                run_module(st, profile, limits=limits)
                try:
                    check()
                except OutputsMissing as e:
                    raise StageError(f"{st.label} (profile {profile}): {e}") from None
        except StageError as e:
            if expired.is_set() and not isinstance(e, StageTimeout):
                cell = re.search(r"in (cell \d+ \([^\n]*?\))", str(e))
                raise StageTimeout(f"{st.label} (profile {profile}) ran past its stage timeout of {limits.stage_s:.0f} s "
                                   f"({limits.stage_why}){' in ' + cell.group(1) if cell else ''}; every process it "
                                   f"started was ended") from None
            raise
        finally:
            timer.cancel()
            left = end_processes(stage_id)
            if left:
                print(f">> {st.name} left {len(left)} process(es) running; ended", flush=True)


def _print_timings(rows: list[tuple[str, float, str]], total: float) -> None:
    print("\n=== timings (this run)")
    for name, dt, status in rows:
        print(f"  {dt:8.1f} s  {name:<16} {status}")
    print(f"  {total:8.1f} s  total")


def recorded_answers(profile: str) -> dict[str, int] | None:
    """What the latest run of a profile recorded about its model answers (record_answers), if any."""
    f = ARTIFACTS_ROOT / profile / "timings.json"
    try:
        return dict(read_json(f)["answers"]) if f.exists() else None
    except (KeyError, TypeError, ValueError):
        return None
