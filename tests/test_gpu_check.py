"""`python -m lib.compendium.gpu_check`: the GPU checks' code, run here at tiny shapes on the CPU, in a process whose
image lacks the packages a plain CUDA image lacks (the check is for a GPU machine with no pip)."""
import json
import subprocess
import sys

import pytest

from lib import ROOT

BLOCK = ("import sys, importlib.abc\n"
         "class Block(importlib.abc.MetaPathFinder):\n"
         "    def find_spec(self, name, path, target=None):\n"
         "        if name.split('.')[0] in {'open_clip', 'ftfy', 'wcwidth', 'jsonschema', 'jsonschema_specifications',"
         " 'referencing', 'rpds', 'json_repair'}:\n"
         "            raise ModuleNotFoundError(f'no module {name!r}', name=name)\n"
         "sys.meta_path.insert(0, Block())\n")


def test_the_gpu_check_runs_without_the_packages_a_cuda_image_lacks(tmp_path):
    out = tmp_path / "check.json"
    only = "cut_answer_error,two_precisions,host_syncs,refusal_before_allocation,clip4dm_ratio"
    r = subprocess.run([sys.executable, "-c", BLOCK + "from lib.compendium.gpu_check import main\n"
                        f"sys.exit(main(['--toy', '--only', '{only}', '--out', r'{out}']))"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    lines = [ln for ln in r.stdout.splitlines() if ln.split(" ")[0] in ("PASS", "FAIL", "SKIP", "INFO")]
    assert [ln.split(" ")[1].rstrip(":") for ln in lines] == only.split(",")
    rec = json.loads(out.read_text())
    status = {c["check"]: c["status"] for c in rec["checks"]}
    assert status["cut_answer_error"] == status["two_precisions"] == "PASS"
    if rec["device"] == "CPU":
        assert status["host_syncs"] == status["refusal_before_allocation"] == "SKIP"
    detail = next(c["detail"] for c in rec["checks"] if c["check"] == "clip4dm_ratio")
    assert status["clip4dm_ratio"] == "SKIP" and "missing package open_clip" in detail


def test_a_failing_check_fails_the_command_and_the_rest_still_run(tmp_path, monkeypatch):
    from lib.compendium import gpu_check
    monkeypatch.setattr(gpu_check, "check_cut_answer_error", lambda run: (_ for _ in ()).throw(RuntimeError("broken")))
    monkeypatch.setattr(gpu_check, "check_two_precisions", lambda run: (True, "fine", {}))
    lines = []
    rc, path = gpu_check.run_checks(toy=True, only=("cut_answer_error", "two_precisions"), work=tmp_path / "w",
                                    out=tmp_path / "r.json", echo=lines.append)
    assert rc == 1 and lines[0] == "FAIL cut_answer_error: RuntimeError: broken" and lines[1] == "PASS two_precisions: fine"
    assert json.loads(path.read_text())["checks"][0]["traceback"]
    assert gpu_check.main(["--toy", "--only", "nothing"]) == 2


def test_a_machine_without_torch_gets_an_error_naming_it_and_no_record(tmp_path):
    out = tmp_path / "check.json"
    block = BLOCK.replace("'json_repair'}", "'json_repair', 'torch'}")
    r = subprocess.run([sys.executable, "-c", block + "from lib.compendium.gpu_check import main\n"
                        f"sys.exit(main(['--toy', '--only', 'two_precisions', '--out', r'{out}']))"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "torch does not import here" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()


def test_a_gpu_check_record_is_what_the_cost_table_reads(tmp_path, monkeypatch):
    """gpu_check writes measure's records at its record's top level beside its checks, so a record copied under
    results/gpu/ shows in the cost table."""
    from lib.compendium import costs, gpu_check
    monkeypatch.setattr(gpu_check, "check_clip4dm_ratio", lambda run: (
        run.parts.__setitem__("clip4dm", {"device": "NVIDIA H100 80GB HBM3", "torch": "2.14.1", "runs": [
            {"shape": "H/14", "from_files_pairs_per_s": 50.0}]}) or (True, "measured", {})))
    rc, path = gpu_check.run_checks(toy=True, only=("clip4dm_ratio",), work=tmp_path / "w",
                                    out=tmp_path / "gpu" / "h100.json", echo=lambda s: None)
    rec = json.loads(path.read_text())
    assert rc == 0 and rec["clip4dm"]["runs"][0]["shape"] == "H/14" and rec["clip4dm"]["commit"]
    monkeypatch.setattr(costs, "MEASURED_DIR", tmp_path / "gpu")
    row = next(r for r in costs.cost_rows("paper") if r.stage == "03 CLIP4DM")
    assert row.kind == "measured" and "h100.json" in row.settings


def test_what_cannot_fail_is_info_a_broken_import_fails_and_no_gpu_is_refused(tmp_path, monkeypatch):
    """A measurement with no threshold is INFO, never a PASS; a module of this project that does not import is a
    FAIL (only another package's absence is a SKIP); the full checks on a machine with no GPU are refused (they
    would all be SKIPs), and the record is written atomically."""
    from lib.compendium import gpu_check
    monkeypatch.setattr(gpu_check.Run, "agent_rows", lambda self: {"runs": [{"update_share": {
        "dtype": "bfloat16", "first_step": 0.1, "last_step": 0.05, "sampled": 1000}}]})

    def broken(run):
        raise ModuleNotFoundError("No module named 'lib.sei.nothing'", name="lib.sei.nothing")

    def absent(run):
        raise ModuleNotFoundError("No module named 'flash_attn'", name="flash_attn")
    monkeypatch.setattr(gpu_check, "check_cut_answer_error", broken)
    monkeypatch.setattr(gpu_check, "check_two_precisions", absent)
    lines = []
    rc, path = gpu_check.run_checks(toy=True, only=("agent_update_share", "cut_answer_error", "two_precisions"),
                                    work=tmp_path / "w", out=tmp_path / "r.json", echo=lines.append)
    assert [ln.split(" ")[0] for ln in lines[:3]] == ["INFO", "FAIL", "SKIP"] and rc == 1
    assert "missing package flash_attn" in lines[2] and "lib.sei.nothing" in lines[1]
    assert lines[3].startswith("1 of 3 checks failed, 0 passed, 1 skipped, 1 reported without a threshold")
    assert not list(tmp_path.glob("*.tmp")) and json.loads(path.read_text())["checks"][0]["status"] == "INFO"
    monkeypatch.setattr(gpu_check, "_cuda", lambda: False)
    with pytest.raises(ValueError, match="no GPU here"):
        gpu_check.run_checks(toy=False, only=("two_precisions",), work=tmp_path / "w2", out=tmp_path / "x.json")
    assert gpu_check.main(["--only", "two_precisions", "--out", str(tmp_path / "x.json")]) == 2
    assert not (tmp_path / "x.json").exists()
