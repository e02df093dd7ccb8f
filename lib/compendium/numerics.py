"""CPU numerics pinned to one code path, so that a model trained on one x86-64 CPU has the same bits as
the same model trained on another: measured to hold between machines of one kind, and measured NOT to hold
across every kind (below, "Measured").

Why: the embedded profile trains its models on CPU, and their outputs (captions, agents' texts, retrieved
neighbours) are written into the prompts of the served model, whose answers are cached by request. Left to
themselves torch (ATen's vector kernels), MKL (its GEMM kernels) and oneDNN (its convolutions, whose
blocking also follows the cache sizes) each pick the widest instructions the CPU has, and each choice
sums in another order: weights trained on an AVX-512 CPU differ in the last bits from weights trained on
an AVX2-only one, the prompts differ, and a fresh clone's `make reproduce` on the other kind of machine
asks every answer afresh instead of replaying the committed ones.

Pinned (the default) fixes every such choice to one meant to run the same way on any x86-64 CPU with AVX2
(every server CPU since 2013-2015; "Measured" below says where it does not):

- ``ATEN_CPU_CAPABILITY=avx2``: torch's vector kernels use the AVX2 build whatever the CPU offers;
- ``MKL_CBWR=AVX2``: MKL's conditional numerical reproducibility on its AVX2 branch (same-speed GEMM
  here; its ``COMPATIBLE`` branch is about three times slower);
- ``MKL_ENABLE_INSTRUCTIONS=AVX2``: unset, ``MKL_CBWR`` already caps MKL the same way; it is pinned so that
  a user's own value, which outranks ``MKL_CBWR`` (even ``AVX2,STRICT``: an ``AVX512`` there trains other bits
  on an AVX-512 Intel CPU), is named by `check` and the run's machine line instead of passing unseen;
- ``OPENBLAS_CORETYPE=Haswell``: numpy's and scipy's OpenBLAS on its AVX2 kernels;
- ``ONEDNN_MAX_CPU_ISA=AVX2``, and oneDNN switched off in torch once it is imported (convolutions fall
  back to torch's own im2col + GEMM, whose order does not depend on cache sizes);
- torch's intra-op threads fixed to ``PINNED_THREADS`` (a reduction split over more threads sums in another
  order); a stage that sets its own thread count (the trainers do) keeps it.

Measured: the committed embedded and ci results were trained on an AMD EPYC; an AVX-512 Intel Xeon, pinned the
same way, trains other bits (there, make test's ci run asked 4,063 answers afresh). Not identified which library
differs; one candidate is MKL, whose ``MKL_CBWR`` branches are documented as exact on Intel CPUs only. So answers
are committed per kind of machine (`make test-answers KEEP=1` adds a kind's), and a fresh clone replays the
committed answers only on the kind that asked them.

``COMPENDIUM_CPU_NUMERICS=native`` leaves every choice to the libraries (faster on a large machine; the
results then match the committed ones only on the same kind of CPU). GPUs are not affected: on CUDA the
paper profile's numbers come from cuBLAS and cuDNN as usual. So the paper profile (and a profile extending
it) on a machine with a visible NVIDIA GPU runs native unless `COMPENDIUM_CPU_NUMERICS` says otherwise
(`mode_for`): two threads, AVX2 and no oneDNN would only slow its CPU side (decoding, tokenising, the
data loaders) for bits no committed result depends on.

The environment part must be in place before torch, MKL or OpenBLAS load: `import lib` applies it (it
imports no heavy package), `make` exports it, and `lib.compendium.stages.run_env` hands it to every
notebook kernel. A process that imported torch or numpy before `import lib` runs unpinned:
`check()` says so.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

#: the switch: "pinned" (default) or "native"
MODE_ENV = "COMPENDIUM_CPU_NUMERICS"
#: torch's intra-op threads while pinned (the embedded profile's machine has 2 cores)
THREADS_ENV = "COMPENDIUM_CPU_THREADS"
PINNED_THREADS = 2

#: the environment every pinned process starts with
PINNED_ENV = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "OPENBLAS_CORETYPE": "Haswell",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
}


def mode(env=None) -> str:
    value = (os.environ if env is None else env).get(MODE_ENV, "pinned").strip().lower() or "pinned"
    if value not in ("pinned", "native"):
        raise ValueError(f"{MODE_ENV}={value!r}: expected 'pinned' or 'native'")
    return value


def pinned_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's environment) with the pinned choices added, each unless already
    set (a user's own choice wins, and is visible in the saved record); unchanged in native mode."""
    out = dict(os.environ if env is None else env)
    if mode(out) == "pinned":
        for k, v in PINNED_ENV.items():
            out.setdefault(k, v)
    return out


def threads() -> int:
    value = os.environ.get(THREADS_ENV, str(PINNED_THREADS))
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"{THREADS_ENV}={value!r}: expected a whole number of threads") from None
    if n < 1:
        raise ValueError(f"{THREADS_ENV}={n}: expected at least 1 thread")
    return n


def pin_torch(torch) -> None:
    """What cannot be set before torch loads: oneDNN off, the intra-op threads fixed."""
    if mode() != "pinned":
        return
    torch.backends.mkldnn.enabled = False
    torch.set_num_threads(threads())


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Runs `pin_torch` right after `import torch` finishes, wherever that import happens."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)                       # once; and find_spec below must not find us again
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module):
            run(module)
            pin_torch(module)

        loader.exec_module = exec_module
        return spec


#: the PINNED_ENV keys `apply` set in this process (a user's own setting is not among them)
SET_HERE: set[str] = set()


def gpu_visible(env=None) -> bool:
    """Whether this machine shows an NVIDIA GPU to this process, without importing torch (the driver's device
    list, unless CUDA_VISIBLE_DEVICES hides every device)."""
    env = os.environ if env is None else env
    if env.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    gpus = "/proc/driver/nvidia/gpus"
    return os.path.isdir(gpus) and bool(os.listdir(gpus))


def mode_for(profiles: list[str], env=None) -> str:
    """The mode a stage of a profile (`profiles`: it and the profiles it extends) runs in: the user's
    COMPENDIUM_CPU_NUMERICS when set; native for the paper profile on a machine with a visible GPU; else pinned."""
    env = os.environ if env is None else env
    if env.get(MODE_ENV, "").strip():
        return mode(env)
    return "native" if "paper" in profiles and gpu_visible(env) else "pinned"


def apply() -> None:
    """Pin this process (called by `import lib`): the environment now, torch when it loads (or at once,
    if it already has)."""
    if mode() != "pinned":
        return
    for k, v in PINNED_ENV.items():
        if k not in os.environ:
            os.environ[k] = v
            SET_HERE.add(k)
    if "torch" in sys.modules:
        pin_torch(sys.modules["torch"])
    elif not any(isinstance(f, _AfterTorch) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTorch())


def check() -> list[str]:
    """What in this process does not follow the pinned choices (empty when all do, or in native mode):
    a library loaded before `import lib` set the environment keeps its own choice."""
    if mode() != "pinned":
        return []
    problems = [f"{k}={os.environ.get(k)!r} (pinned: {v!r})" for k, v in PINNED_ENV.items() if os.environ.get(k) != v]
    torch = sys.modules.get("torch")
    if torch is not None:
        cap = torch.backends.cpu.get_cpu_capability()
        if cap not in ("AVX2", "DEFAULT"):                 # DEFAULT: a CPU without AVX2, which then runs the plain kernels
            problems.append(f"torch's vector kernels run {cap} (pinned: AVX2): torch was imported before `import lib`")
        if torch.backends.mkldnn.enabled:
            problems.append("oneDNN is on in torch (pinned: off)")
    return problems


def short() -> str:
    """A few words for a machine line."""
    return "pinned CPU numerics" if mode() == "pinned" and not check() else (
        "native CPU numerics" if mode() != "pinned" else "CPU numerics not fully pinned")
