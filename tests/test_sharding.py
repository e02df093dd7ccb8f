"""Work shared over the processes of a launch (lib.compendium.sharding): chunk j to rank j mod N, every result on
every rank in the one-process order; CLIP4DM's attributions and an agent's generations on 2 CPU processes equal one
process's."""
import json

import pytest

from lib.compendium import sharding


def test_chunks_go_round_robin_and_come_back_in_order(monkeypatch):
    items = list(range(11))
    assert sharding.chunks(items, 3) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10]]
    assert sharding.mine(4, 0, 2) == [0, 2] and sharding.mine(4, 1, 2) == [1, 3] and sharding.mine(1, 1, 2) == []
    with pytest.raises(ValueError, match="at least 1"):
        sharding.chunks(items, 0)
    ran = {}

    def run_as(rank):
        def run(part):
            ran.setdefault(rank, []).append(part)
            return [10 * x for x in part]
        return run
    # what each of two ranks computes, then the gather every rank sees
    shares = [({j: run_as(r)(sharding.chunks(items, 3)[j]) for j in sharding.mine(4, r, 2)}, None) for r in (0, 1)]
    monkeypatch.setattr(sharding, "_gather", lambda done: shares)
    assert sharding.all_chunks(items, 3, run_as(0), (0, 2)) == [10 * x for x in items]
    monkeypatch.setattr(sharding, "_gather", lambda done: shares[:1])          # a rank's chunks never came back
    with pytest.raises(RuntimeError, match=r"chunks \[1, 3\] came back from no process"):
        sharding.all_chunks(items, 3, run_as(0), (0, 2))
    # a rank whose work raised: every other rank raises too, naming it (none waits in the gather for its chunks)
    monkeypatch.setattr(sharding, "_gather", lambda done: [shares[0], ({}, "OSError: disk full")])
    with pytest.raises(RuntimeError, match=r"failed on 1 of the 2 processes: rank 1: OSError: disk full"):
        sharding.all_chunks(items, 3, run_as(0), (0, 2))
    sent = []                                       # and the rank that raised joins the gather before re-raising

    def fail(part):
        raise KeyError("chunk 0")
    monkeypatch.setattr(sharding, "_gather", lambda done: sent.append(done) or [done, shares[1]])
    with pytest.raises(KeyError, match="chunk 0"):
        sharding.all_chunks(items, 3, fail, (0, 2))
    assert sent == [({}, "KeyError: 'chunk 0'")]
    assert sharding.all_chunks(items, 4, lambda p: [x + 1 for x in p], (0, 1)) == [x + 1 for x in items]
    with pytest.raises(ValueError, match="a chunk of 4 items gave 1 results"):
        sharding.all_chunks(items, 4, lambda p: p[:1], (0, 1))
    monkeypatch.setenv("WORLD_SIZE", "x")
    with pytest.raises(ValueError, match="not whole numbers"):
        sharding.launch()


def _launch(n: int, tiny_clip_dir, tiny_paligemma, images, out):
    import os
    import socket
    from tests.conftest import run_launch
    import sys
    from lib import ROOT
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (out / "tmp").mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TMPDIR": str(out / "tmp")}
    r = run_launch([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(n), "--master_addr",
                    "127.0.0.1", "--master_port", str(port), str(ROOT / "tests" / "dist_shard_worker.py"),
                    str(tiny_clip_dir), str(tiny_paligemma), str(images), str(out)],
                   300, env, cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return [json.loads((out / f"rank{k}.json").read_text()) for k in range(n)]


def test_two_processes_attribute_and_generate_what_one_process_does(tiny_clip_dir, tiny_paligemma, tmp_path):
    """The same worker launched as one process and as two (each computing every other chunk of pairs and of
    conversations, with the image batches those need): the same rows, bit for bit, and the same answers on
    every process; each pair is computed once, by one process, and a later run reads the launch's files back."""
    import numpy as np
    from PIL import Image
    from lib.clip4dm.method import CLIP4DM
    from lib.clip4dm.runs import attribute_pairs
    rng = np.random.default_rng(4)
    paths = []
    for i in range(5):
        p = tmp_path / f"img{i}.png"
        Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(p)
        paths.append(str(p))
    (tmp_path / "images.json").write_text(json.dumps(paths))
    one = _launch(1, tiny_clip_dir, tiny_paligemma, tmp_path / "images.json", tmp_path / "one")[0]
    out = tmp_path / "two"
    got = _launch(2, tiny_clip_dir, tiny_paligemma, tmp_path / "images.json", out)
    assert got[0] == got[1]                                   # every process holds every result
    assert got[0]["rows"] == one["rows"] and got[0]["answers"] == one["answers"]
    assert len(one["rows"]) == 11 and len(one["answers"]) == 5
    files = sorted(p.name for p in out.glob("attr.jsonl*"))
    assert "attr.jsonl.rank0" in files and "attr.jsonl.rank1" in files
    lines = sum(len((out / f).read_text().splitlines()) for f in files)
    assert lines == 11                                        # each pair computed once, by one process
    pairs = [(paths[(3 * i) % len(paths)], f"caption number {i} of a red sun") for i in range(11)]
    again = attribute_pairs(CLIP4DM.from_pretrained(tiny_clip_dir, device="cpu", epsilon=0.0), pairs,
                            out / "attr.jsonl", batch_size=2, progress=False, workers=0)
    assert [r["key"] for r in again] == [r["key"] for r in one["rows"]]   # read back from the launch's files
    assert sum(len((out / f).read_text().splitlines()) for f in out.glob("attr.jsonl*")) == lines   # none recomputed


def test_a_launch_that_runs_past_its_timeout_leaves_no_worker(tmp_path):
    """The launches above end every process they started when they time out, workers in sessions of their own
    included (subprocess.run's timeout kills the launcher alone)."""
    import os
    import subprocess
    import sys
    import time
    from lib.compendium import procs
    from tests.conftest import run_launch
    pid_file = tmp_path / "worker.pid"
    code = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],"
            f" start_new_session=True); open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(120)")
    with pytest.raises(subprocess.TimeoutExpired):
        run_launch([sys.executable, "-c", code], 8, dict(os.environ))
    # the launcher writes the worker's pid before its timeout (8 s lets it start on a loaded machine)
    assert pid_file.exists() and pid_file.read_text(), "the launch never started its worker: nothing was checked"
    worker = int(pid_file.read_text())
    time.sleep(0.2)
    assert procs._state(worker) in (None, "Z", "X"), "the launch's worker outlived it"
