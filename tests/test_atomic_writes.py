"""Atomic files and folders: a failed or killed write never leaves a half-written target, a mixed
model folder, or temporaries that outlive it."""
import json
import os
import subprocess

import numpy as np
import pytest

from lib.compendium.artifacts import atomic_path, write_text, write_with
from lib.models.embedded import _cached, _stamp
from lib.compendium.artifacts import save_folder_atomically


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_a_killed_writers_temporaries_are_swept_and_a_live_writers_kept(tmp_path):
    target = tmp_path / "x.json"
    stale = [tmp_path / f".x.json.{dead_pid()}.abc{i}.tmp" for i in range(3)]
    live = tmp_path / f".x.json.{os.getppid()}.live.tmp"            # another running process's write in flight
    for f in [*stale, live]:
        f.write_text("partial")
    write_text(target, "{}")
    assert target.read_text() == "{}" and live.exists() and not any(f.exists() for f in stale)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([target.name, live.name])


@pytest.mark.parametrize("failure", ["raises", "keyboard interrupt", "writes elsewhere"])
def test_a_failed_write_leaves_the_old_target_and_no_temporary(tmp_path, failure):
    target = tmp_path / "emb.npy"
    target.write_bytes(b"old")

    def writer(tmp):
        if failure == "writes elsewhere":
            np.save(str(tmp), np.zeros(3))                              # numpy appends .npy to the name
            return
        tmp.write_bytes(b"half")
        raise (KeyboardInterrupt if failure == "keyboard interrupt" else RuntimeError)("boom")
    with pytest.raises((RuntimeError, KeyboardInterrupt, OSError)):
        write_with(target, writer)
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["emb.npy"]


def test_atomic_path_gives_a_name_numpy_keeps_when_handed_a_file_object(tmp_path):
    target = tmp_path / "emb.npz"
    with atomic_path(target) as tmp, open(tmp, "wb") as f:
        np.savez(f, a=np.arange(3))
    assert np.load(target)["a"].tolist() == [0, 1, 2] and [p.name for p in tmp_path.iterdir()] == ["emb.npz"]


def test_a_model_folder_is_swapped_whole_or_not_at_all(tmp_path):
    out = tmp_path / "model"
    save_folder_atomically(out, lambda d: [(d / n).write_text(n + "-v1") for n in ("a.bin", "config.json")])
    (tmp_path / ".model.4242.new.swap").mkdir()                     # a killed swap's leftover

    def half(d):
        (d / "a.bin").write_text("a.bin-v2")
        raise RuntimeError("killed while saving")
    with pytest.raises(RuntimeError):
        save_folder_atomically(out, half)
    assert {p.name: p.read_text() for p in out.iterdir()} == {"a.bin": "a.bin-v1", "config.json": "config.json-v1"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]   # no hidden sibling survives
    save_folder_atomically(out, lambda d: (d / "b.bin").write_text("v2"))
    assert [p.name for p in out.iterdir()] == ["b.bin"]              # the new folder alone, no old file mixed in


def test_a_stamped_model_folder_is_reused_only_while_its_files_are_the_ones_stamped(tmp_path):
    out = tmp_path / "model"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"weights-v1")
    (out / "training.json").write_text(json.dumps({"metrics": {}}))
    _stamp(out, "key1")
    assert _cached(out, "key1") is not None and _cached(out, "key2") is None
    (out / "model.safetensors").write_bytes(b"weights-v2")             # replaced by a run killed before its stamp
    assert _cached(out, "key1") is None
    (out / "model.safetensors").write_bytes(b"weights-v1")
    (out / "extra.bin").write_bytes(b"x")                               # a file the stamp does not know
    assert _cached(out, "key1") is None


# ---------------------------------------------------------------- the umask's mode, and durable renames
@pytest.fixture
def umask():
    old = os.umask(0o022)
    os.umask(old)

    def set_(mask):
        os.umask(mask)
    yield set_
    os.umask(old)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664), (0o000, 0o666)])
def test_a_new_file_gets_the_mode_a_plain_open_would(tmp_path, umask, mask, mode):
    """mkstemp makes 0600 files and a rename keeps that: every artifact and saved notebook was unreadable to
    the group and others whatever the umask. Now the umask decides, as for `open`."""
    umask(mask)
    import stat
    from lib.compendium.artifacts import current_umask
    assert current_umask() == mask
    write_text(tmp_path / "a.json", "{}")
    write_with(tmp_path / "b.bin", lambda p: p.write_bytes(b"x"))
    with open(tmp_path / "plain.txt", "w") as f:
        f.write("x")
    for name in ("a.json", "b.bin", "plain.txt"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == mode, name
    out = tmp_path / "model"
    save_folder_atomically(out, lambda d: ((d / "config.json").write_text("{}"), _safetensors(d / "model.safetensors")))
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~mask
    assert stat.S_IMODE((out / "config.json").stat().st_mode) == mode
    # safetensors writes its file 0o600 whatever the umask (a model saved with save_pretrained): the folder's
    # files get the umask's mode too
    assert stat.S_IMODE((out / "model.safetensors").stat().st_mode) == mode


def _safetensors(path):
    import torch
    from safetensors.torch import save_file
    save_file({"w": torch.zeros(2)}, str(path))


def test_an_existing_file_keeps_its_own_mode(tmp_path, umask):
    import stat
    umask(0o022)
    f = tmp_path / "key.json"
    f.write_text("{}")
    f.chmod(0o640)
    write_text(f, '{"a": 1}')
    assert stat.S_IMODE(f.stat().st_mode) == 0o640 and f.read_text() == '{"a": 1}'


def test_the_data_reaches_the_disk_before_the_rename_and_the_folder_after(tmp_path, monkeypatch):
    """Without an fsync before the rename a power cut can leave the new name on an empty file (the rename is
    journalled before the data); without one of the folder after it, the rename itself can be lost."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(a, b):
        events.append(("replace", str(a), str(b)))
        return real_replace(a, b)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    target = tmp_path / "m.json"
    write_text(target, "{}")
    kinds = [e[0] for e in events]
    assert kinds == ["fsync", "replace", "fsync"], events
    assert events[0][1] == events[1][1] and events[1][2] == str(target) and events[2][1] == str(tmp_path)
    events.clear()
    save_folder_atomically(tmp_path / "model", lambda d: [(d / n).write_text(n) for n in ("a.bin", "config.json")])
    swap = [i for i, e in enumerate(events) if e[0] == "replace"][-1]
    synced = [e[1] for e in events[:swap] if e[0] == "fsync"]
    assert sum(p.endswith(("a.bin", "config.json")) for p in synced) == 2          # both files before the swap
    assert events[swap + 1:] == [("fsync", str(tmp_path))]                          # the parent folder after it
