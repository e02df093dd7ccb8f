"""Every process a run starts ends with it: on success, on failure, on SIGINT or SIGTERM, and, after the run itself
was killed with SIGKILL, at the start of the next run.

A process group alone cannot hold a run's processes: the Jupyter kernel starts a session of its own (so that an
interrupt reaches its whole group), and a worker whose parent died is adopted by init. So a run marks its
processes instead: it appends its id to COMPENDIUM_RUN_IDS in the environment every process it starts inherits
(the kernel, its training workers, the model servers, `accelerate launch`, the test lanes), and ends a run by
ending every process whose environment holds that id, group or session regardless. Each run records itself in
artifacts/.runs/<id>.json (its pid and that pid's start time); a run that finds the record of a runner that is no
longer alive (killed with SIGKILL, so it could not clean up) ends what that run left before it starts.

    python -m lib.compendium.procs            # list the runs recorded and the processes each still has
    python -m lib.compendium.procs --end      # end the processes of runs whose runner is gone
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

from lib.compendium.artifacts import ARTIFACTS_ROOT, pid_alive, read_json, write_json

#: the environment variable holding the ids of the runs (and stages) a process belongs to, ':'-separated
RUN_IDS_ENV = "COMPENDIUM_RUN_IDS"
RUNS_DIR = ARTIFACTS_ROOT / ".runs"


def _start_time(pid: int) -> str | None:
    """The pid's start time in clock ticks since boot (/proc/<pid>/stat field 22): a pid reused by another
    process has another start time."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _run_ids(pid: int) -> list[str]:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return []
    for entry in env.split(b"\0"):
        if entry.startswith(RUN_IDS_ENV.encode() + b"="):
            return entry.split(b"=", 1)[1].decode(errors="replace").split(":")
    return []


def processes_of(run_id: str) -> list[int]:
    """The live processes (zombies aside) whose environment names `run_id`, this process excepted."""
    me = os.getpid()
    out = []
    for d in Path("/proc").glob("[0-9]*"):
        pid = int(d.name)
        if pid != me and run_id in _run_ids(pid) and _state(pid) not in (None, "Z", "X"):
            out.append(pid)
    return sorted(out)


def end_processes(run_id: str, grace_s: float = 3.0) -> list[int]:
    """End every process of `run_id`: SIGTERM first (a server closes its socket, a worker its files), then,
    after `grace_s`, freeze what is left (SIGSTOP: nothing new starts, nothing escapes) and SIGKILL it, until
    none is left. Returns the pids it signalled."""
    ended: list[int] = []
    pids = processes_of(run_id)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    ended += pids
    deadline = time.time() + grace_s
    while pids and time.time() < deadline:
        time.sleep(0.05)
        pids = processes_of(run_id)
    for _ in range(50):
        pids = processes_of(run_id)
        if not pids:
            break
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
        ended += pids
        time.sleep(0.05)
    return sorted(set(ended))


def _record(run_id: str) -> Path:
    return RUNS_DIR / f"{run_id}.json"


def recorded_runs() -> list[dict]:
    """The runs recorded in artifacts/.runs/ (one file each), with whether their runner is still alive."""
    out = []
    for f in sorted(RUNS_DIR.glob("*.json")) if RUNS_DIR.exists() else []:
        try:
            rec = read_json(f)
            pid, started = int(rec["pid"]), rec.get("pid_start")
        except (ValueError, KeyError, TypeError, OSError):
            rec, pid, started = {"run_id": f.stem, "pid": -1}, -1, None
        rec["alive"] = pid > 0 and pid_alive(pid) and (started is None or _start_time(pid) == started)
        rec["file"] = f
        out.append(rec)
    return out


def end_orphaned_runs(quiet: bool = False) -> list[int]:
    """End the processes of every recorded run whose runner is gone (killed with SIGKILL: it could not clean up),
    and drop their records. Returns the pids ended."""
    ended = []
    for rec in recorded_runs():
        if rec["alive"]:
            continue
        pids = end_processes(str(rec.get("run_id", rec["file"].stem)))
        if pids and not quiet:
            print(f">> ended {len(pids)} process(es) a killed run left behind ({rec.get('what', 'a run')}, "
                  f"started {rec.get('started', '?')}): {', '.join(map(str, pids))}", flush=True)
        ended += pids
        rec["file"].unlink(missing_ok=True)
    return ended


def new_id(prefix: str = "run") -> str:
    return f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def tagged(run_id: str) -> Iterator[str]:
    """Every process started inside the block carries `run_id` (appended to COMPENDIUM_RUN_IDS)."""
    old = os.environ.get(RUN_IDS_ENV)
    os.environ[RUN_IDS_ENV] = f"{old}:{run_id}" if old else run_id
    try:
        yield run_id
    finally:
        if old is None:
            os.environ.pop(RUN_IDS_ENV, None)
        else:
            os.environ[RUN_IDS_ENV] = old


class Stopped(SystemExit):
    """SIGTERM or SIGHUP reached a run: it unwinds (its processes ended) and exits 128 + the signal."""


@contextlib.contextmanager
def owned_run(what: str) -> Iterator[str]:
    """A run that owns every process it starts: the leftovers of killed runs are ended first; SIGTERM and SIGHUP
    unwind the run as SIGINT does; when the block ends, however it ends, every process the run started is
    ended. The run is recorded in artifacts/.runs/ while it lasts (the next run ends what it left if it is
    killed with SIGKILL)."""
    end_orphaned_runs()
    run_id = new_id()
    RUNS_DIR.mkdir(parents=True, exist_ok=True)
    write_json(_record(run_id), {"run_id": run_id, "pid": os.getpid(), "pid_start": _start_time(os.getpid()),
                                 "what": what, "started": time.strftime("%Y-%m-%dT%H:%M:%S")})

    def stop(signum, frame):
        raise Stopped(128 + signum)
    old = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError):        # not the main thread: signals stay as they were
            old[sig] = signal.signal(sig, stop)
    try:
        with tagged(run_id):
            yield run_id
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        left = end_processes(run_id)
        if left:
            print(f">> ended {len(left)} process(es) the run had started and left running", flush=True)
        _record(run_id).unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--end", action="store_true", help="end the processes of runs whose runner is gone")
    args = ap.parse_args(argv)
    if args.end:
        print(f"ended {len(end_orphaned_runs())} process(es)")
        return 0
    for rec in recorded_runs():
        run_id = str(rec.get("run_id", rec["file"].stem))
        print(f"{run_id}: {rec.get('what', '?')}, runner pid {rec.get('pid')} "
              f"{'alive' if rec['alive'] else 'gone'}; processes: {processes_of(run_id) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
