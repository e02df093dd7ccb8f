"""One command for a GPU machine whose image has torch, transformers and accelerate but no pip and no network:
`PYTHONPATH=. python -m lib.compendium.gpu_check` runs the paper profile's GPU paths at their full shapes with
random weights (nothing is downloaded) and writes one JSON record plus a PASS / FAIL / SKIP / INFO line per check
(INFO: a measurement reported with no threshold to pass):

- `agent_memory`: the paper's agent recipe (`params/paper.yaml`) through `train_agent` at batches 2, 4 and 8, with
  and without gradient checkpointing: the measured peak against `lib.models.train_memory`'s estimate (the peak
  may not exceed it by more than 15%; a refused setting is one the estimate says cannot fit);
- `agent_mfu`: model-FLOPs utilisation of the same runs against the GPU's datasheet peak (`lib.compendium.measure`);
- `agent_memory_left`: what the device still holds once `train_agent` has returned (at most 0.25 GiB);
- `agent_update_share` (INFO): the share of weights the first and last updates changed (bfloat16 at the paper's lr
  loses most of them, the `float32_master_weights` option keeps them);
- `host_syncs`: host synchronisations per training step (torch's sync debug mode) of the answer-only loss, against
  the model's own forward and backward: the loss may add none;
- `refusal_before_allocation`: a recipe that cannot fit is refused before anything reaches the GPU;
- `cut_answer_error`: a max_len that cuts away whole answers is an error naming them;
- `two_precisions`: one process trains an agent in bf16, then one in fp16;
- `clip4dm_ratio`: CLIP4DM from image files against its floor on the production path (`lib.clip4dm.runs`);
- `trace_rate`: TRACE's feature cache and epoch at the L/14 shape.

Each check imports what it needs when it runs: one whose package is missing is a SKIP naming it, not a crash (a
module of this project that fails to import is a FAIL). `--toy` runs every check's code at tiny shapes on whatever
device there is (the tests run it on the CPU), a GPU-only check then being a SKIP; without `--toy` a machine with no
GPU is an error (exit 2): the full checks would all be SKIPs, a run that checked nothing. Exit status 1 when a check
fails. The record goes to `artifacts/measured/gpu_check-<gpu>.json`;
copy it under `results/gpu/` to cite it.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

from lib import ROOT
from lib.compendium.artifacts import git_revision, write_text

GIB = 1024 ** 3
#: the measured peak may exceed the estimate by at most this share
PEAK_TOLERANCE = 0.15
#: what the device may still hold once train_agent has returned
LEFT_GIB = 0.25
CHECKS = ("agent_memory", "agent_mfu", "agent_memory_left", "agent_update_share", "host_syncs",
          "refusal_before_allocation", "cut_answer_error", "two_precisions", "clip4dm_ratio", "trace_rate")




class Skip(Exception):
    """A check that cannot run here (no GPU, a missing package): reported, never a failure."""


def _cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def count_host_syncs(fn: Callable[[], Any]) -> int:
    """Synchronisations of the host with the GPU while `fn` runs, as torch's sync debug mode reports them."""
    import torch
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
            torch.cuda.current_stream().synchronize()     # not counted: the mode is still on, but this is an API call
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


class Run:
    """The state the checks share: a work folder, the device, the agent measurement (run once)."""

    def __init__(self, toy: bool, work: Path):
        self.toy, self.work = toy, work
        self.agent: dict[str, Any] | None = None
        self.parts: dict[str, Any] = {}        # measure's records, at the record's top level for lib.compendium.costs

    def agent_rows(self) -> dict[str, Any]:
        if self.agent is None:
            from lib.compendium.measure import measure_agent  # lazy: a missing package is a SKIP
            self.agent = measure_agent(batch_sizes=(2,) if self.toy else (2, 4, 8),
                                       checkpointing=(False, True), toy=self.toy, work=self.work / "agent")
            self.parts["agent_training"] = self.agent
        return self.agent

    def tiny_paligemma(self) -> Path:
        from lib.models import smoke  # lazy: a missing package is a SKIP
        d = self.work / "tiny_pg"
        if not (d / "config.json").exists():
            smoke.paligemma(d)
        return d

    def examples(self, n: int = 8):
        from lib.compendium.measure import long_examples  # lazy: a missing package is a SKIP
        return long_examples(self.work / "memes", n, words=20)


def check_agent_memory(run: Run) -> tuple[bool, str, dict]:
    rec = run.agent_rows()
    if not _cuda():
        raise Skip("no GPU: the peak is a GPU measurement (the toy run checked the code)")
    bad, parts = [], []
    if not any("refused" not in r for r in rec["runs"]):
        return False, "every setting was refused: no peak was measured", {"runs": rec["runs"]}
    for r in rec["runs"]:
        tag = f"batch {r['batch_size']}{' ckpt' if r['gradient_checkpointing'] else ''}"
        if "refused" in r:
            parts.append(f"{tag}: refused")
            continue
        ratio = r["peak_gib"] / r["estimate_gib"]
        parts.append(f"{tag}: peak {r['peak_gib']:.1f} / estimate {r['estimate_gib']:.1f} GiB")
        if ratio > 1 + PEAK_TOLERANCE:
            bad.append(tag)
    return not bad, "; ".join(parts) + (f"; over the estimate by more than {PEAK_TOLERANCE:.0%}: {bad}" if bad else ""), {
        "runs": rec["runs"]}


def check_agent_mfu(run: Run) -> tuple[bool, str, dict]:
    rec = run.agent_rows()
    rows = [r for r in rec["runs"] if "refused" not in r]
    if not _cuda():
        raise Skip("no GPU")
    vals = [r["mfu"] for r in rows if r.get("mfu") is not None]
    if not vals:
        raise Skip(f"{rec['device']}: no datasheet peak in lib.compendium.measure.DATASHEET_BF16_TFLOPS")
    ok = all(0 < v < 1 for v in vals)
    return ok, ", ".join(f"batch {r['batch_size']}{' ckpt' if r['gradient_checkpointing'] else ''} "
                         f"{100 * r['mfu']:.1f}%" for r in rows), {"mfu": vals}


def check_agent_memory_left(run: Run) -> tuple[bool, str, dict]:
    rec = run.agent_rows()
    if not _cuda():
        raise Skip("no GPU")
    left = [r["left_gib"] for r in rec["runs"] if r.get("left_gib") is not None]
    if not left:
        return False, "no run measured what the device held after train_agent", {}
    return max(left) <= LEFT_GIB, f"at most {max(left):.2f} GiB held after train_agent returned " \
        f"(allowed {LEFT_GIB} GiB)", {"left_gib": left}


def check_agent_update_share(run: Run) -> tuple[bool, str, dict]:
    rows = [r for r in run.agent_rows()["runs"] if r.get("update_share")]
    if not rows:
        return False, "no run recorded its update share", {}
    u = rows[0]["update_share"]
    return None, (f"{u['dtype']} weights: the first update changed {100 * u['first_step']:.1f}% of "
                  f"{u['sampled']:,} sampled weights, the last {100 * u['last_step']:.1f}%"), {"update_share": u}


def check_host_syncs(run: Run) -> tuple[bool, str, dict]:
    if not _cuda():
        raise Skip("no GPU: torch's sync debug mode counts CUDA synchronisations")
    import torch
    from PIL import Image  # lazy: a missing package is a SKIP
    from lib.sei import agents as A  # lazy: a missing package is a SKIP
    model, proc, _ = A._load_base(str(run.tiny_paligemma()), "float32", "sdpa")
    model = model.cuda().train()
    enc = [A.encode_example(proc, Image.new("RGB", (64, 64), (30 * k, 90, 160)), f"explain why {k}",
                            f"because the meme says {k} things", 2048) for k in range(4)]
    batch = A._collate(enc, 0)
    answer = {k: batch.pop(k) for k in A.ANSWER_KEYS}
    batch = {k: v.cuda(non_blocking=True) if hasattr(v, "cuda") else v for k, v in batch.items()}
    answer = {k: v.cuda(non_blocking=True) if hasattr(v, "cuda") else v for k, v in answer.items()}
    torch.cuda.synchronize()
    own = count_host_syncs(lambda: model(**batch).loss.backward())
    mine = count_host_syncs(lambda: A.answer_loss(model, batch, answer, model.get_output_embeddings(),
                                                   contextlib.nullcontext, chunk=8).backward())
    return mine <= own, f"answer-only loss {mine} per step, the model's own loss {own}", {"answer_loss": mine,
                                                                                           "model_loss": own}


def check_refusal_before_allocation(run: Run) -> tuple[bool, str, dict]:
    if not _cuda():
        raise Skip("no GPU: the refusal reads the GPU's free memory")
    import torch
    from lib.models import smoke  # lazy: a missing package is a SKIP
    from lib.models.train_memory import RecipeMemoryError  # lazy: a missing package is a SKIP
    from lib.sei.agents import AgentRecipe, train_agent  # lazy: a missing package is a SKIP
    base = run.work / ("tiny_pg" if run.toy else "pg3b_cpu")
    if not (base / "config.json").exists():
        smoke.paligemma(base, full_shape=not run.toy)
    # a batch no GPU holds: eager attention and every position's logits
    recipe = AgentRecipe(base=str(base), epochs=1, batch_size=4096 if run.toy else 256, max_train=8, max_len=2048,
                         dtype="bfloat16", mixed_precision="bf16", attn_implementation="eager", drop_cut_answers=True)
    before = torch.cuda.memory_allocated()
    try:
        train_agent(run.examples(), run.work / "refused", recipe, "explain why {label} {ocr}", progress=False,
                    force=True)
    except RecipeMemoryError as e:
        after = torch.cuda.memory_allocated()
        return after == before, f"refused ({str(e)[:120]}...); GPU memory {before} -> {after} bytes", {}
    return False, "a recipe that cannot fit was trained", {}


def check_cut_answer_error(run: Run) -> tuple[bool, str, dict]:
    from lib.sei.agents import AgentDataError, AgentRecipe, train_agent  # lazy: a missing package is a SKIP
    recipe = AgentRecipe(base=str(run.tiny_paligemma()), epochs=1, batch_size=2, max_train=4, max_len=1030)
    try:
        train_agent(run.examples(), run.work / "cut", recipe, "explain why {label} {ocr}", progress=False, force=True)
    except AgentDataError as e:
        return "cuts away the whole answer" in str(e), str(e)[:160], {}
    return False, "max_len cut every answer and training went on", {}


def check_two_precisions(run: Run) -> tuple[bool, str, dict]:
    from lib.sei.agents import AgentRecipe, train_agent  # lazy: a missing package is a SKIP
    losses = {}
    for mp in (("bf16", "fp16") if _cuda() else ("bf16", "no")):
        rec = train_agent(run.examples(), run.work / f"prec_{mp}", AgentRecipe(
            base=str(run.tiny_paligemma()), epochs=1, batch_size=4, max_train=8, lr=1e-4, mixed_precision=mp,
            max_len=2048), "explain why {label} {ocr}", progress=False, force=True)
        losses[mp] = rec["curve"][0]["loss"]
    return all(math.isfinite(v) for v in losses.values()), ", ".join(f"{k} loss {v:.3f}" for k, v in losses.items()), \
        {"losses": losses}


def check_clip4dm_ratio(run: Run) -> tuple[bool, str, dict]:
    from lib.compendium.measure import measure_clip4dm  # lazy: a missing package is a SKIP
    rec = measure_clip4dm(shapes=("B/32", "H/14"), batch_sizes=(256,), n=512, toy=run.toy, work=run.work / "clip4dm")
    run.parts["clip4dm"] = rec
    if not _cuda():
        raise Skip("no GPU (the toy run checked the code)")
    ok = all(r["ratio"] > 0 for r in rec["runs"])
    return ok, "; ".join(f"{r['shape']} loader threads {r['workers']}: {r['from_files_pairs_per_s']:.0f} pairs/s from "
                         f"files, ratio to the floor {r['ratio']:.2f}" for r in rec["runs"]), {"clip4dm": rec}


def check_trace_rate(run: Run) -> tuple[bool, str, dict]:
    from lib.compendium.measure import measure_trace  # lazy: a missing package is a SKIP
    rec = measure_trace(n=1000, toy=run.toy, work=run.work / "trace")
    run.parts["trace"] = rec
    if not _cuda():
        raise Skip("no GPU (the toy run checked the code)")
    return rec["cache_memes_per_s"] > 0, (f"feature cache {rec['cache_memes_per_s']:.0f} memes/s, "
                                          f"{rec['epoch_s_per_1000_train']:.1f} s per epoch per 1,000 training memes"), \
        {"trace": rec}


def run_checks(toy: bool = False, only: Sequence[str] = CHECKS, work: Path | None = None,
               out: Path | None = None, echo: Callable[[str], None] = print) -> tuple[int, Path]:
    """Run the checks; print one line each; write the record. Returns (exit status, record path)."""
    try:
        import torch
    except (ImportError, OSError, RuntimeError) as e:   # torch, or its CUDA libraries, cannot load: an error
        raise ValueError(f"torch does not import here ({e}): the checks need torch, transformers and accelerate "
                         "installed in this Python (docs/gpu-costs.md, a GPU machine without pip)") from e
    unknown = sorted(set(only) - set(CHECKS))
    if unknown:
        raise ValueError(f"unknown checks {unknown}; the checks are {', '.join(CHECKS)}")
    if not toy and not _cuda():
        raise ValueError("no GPU here: the full-shape checks would all be SKIPs (a run that checks nothing); "
                         "run with --toy to check their code at tiny shapes on this device")
    tmp = tempfile.TemporaryDirectory(prefix="gpu-check-") if work is None else None
    root = Path(tmp.name) if tmp else Path(work)
    root.mkdir(parents=True, exist_ok=True)
    run = Run(toy, root)
    device = torch.cuda.get_device_name(0) if _cuda() else "CPU"
    results, t_all = [], time.time()
    try:
        for name in only:
            t0 = time.time()
            try:
                ok, detail, data = globals()[f"check_{name}"](run)
                status = "INFO" if ok is None else "PASS" if ok else "FAIL"
            except Skip as e:
                status, detail, data = "SKIP", str(e), {}
            except ImportError as e:
                if (e.name or "").split(".")[0] == "lib" or not e.name:   # this project's own import is broken
                    status, detail, data = "FAIL", f"{type(e).__name__}: {e}", {
                        "traceback": traceback.format_exc()[-2000:]}
                else:
                    status, detail, data = "SKIP", (f"missing package {e.name}: carry its wheel "
                                                    "(docs/gpu-costs.md, a GPU machine without pip)"), {}
            except Exception as e:               # a check that crashes is a failure with its reason, and the rest run
                status, detail, data = "FAIL", f"{type(e).__name__}: {e}", {"traceback": traceback.format_exc()[-2000:]}
            results.append({"check": name, "status": status, "detail": detail, "seconds": round(time.time() - t0, 1),
                            **data})
            echo(f"{status} {name}: {detail}")
    finally:
        if tmp is not None:
            tmp.cleanup()
    record = {"what": "lib.compendium.gpu_check" + (" --toy" if toy else ""), "device": device,
              "torch": torch.__version__, "cuda": torch.version.cuda, "date": time.strftime("%Y-%m-%d"),
              "seconds": round(time.time() - t_all, 1), "checks": results,
              **{k: {**v, "commit": v.get("commit") or git_revision(), "date": time.strftime("%Y-%m-%d")}
                 for k, v in run.parts.items()}}
    slug = re.sub(r"[^A-Za-z0-9]+", "-", device).strip("-").lower()
    path = out or ROOT / "artifacts" / "measured" / f"gpu_check-{slug}{'-toy' if toy else ''}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(record, indent=1, default=str))              # atomic, fsynced, the umask's mode
    failed = [r["check"] for r in results if r["status"] == "FAIL"]
    count = {s: sum(r["status"] == s for r in results) for s in ("PASS", "SKIP", "INFO")}
    echo(f"{len(failed)} of {len(results)} checks failed, {count['PASS']} passed, {count['SKIP']} skipped, "
         f"{count['INFO']} reported without a threshold, in {record['seconds']:.0f} s; record: {path}")
    return (1 if failed else 0), path


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--toy", action="store_true", help="every check's code at tiny shapes (a CPU is fine)")
    ap.add_argument("--only", default=None, help="comma-separated checks: " + ", ".join(CHECKS))
    ap.add_argument("--out", type=Path, default=None, help="the record's path")
    a = ap.parse_args(argv)
    try:
        rc, _ = run_checks(toy=a.toy, only=a.only.split(",") if a.only else CHECKS, out=a.out)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return rc


if __name__ == "__main__":
    sys.exit(main())
