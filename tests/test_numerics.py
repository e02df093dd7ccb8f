"""Pinned CPU numerics (lib/compendium/numerics.py): the environment every process and kernel starts with,
torch's state once it loads, and a small model trained twice under different native hints with the same bits."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lib import ROOT
from lib.compendium import numerics
from lib.compendium.stages import run_env

TRAIN = r"""
import hashlib, json, sys
import lib, torch
torch.manual_seed(0)
class M(torch.nn.Module):
    def __init__(s):
        super().__init__()
        s.conv = torch.nn.Conv2d(3, 16, 8, 8)
        s.enc = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
        s.head = torch.nn.Linear(16, 3)
    def forward(s, x):
        return s.head(s.enc(s.conv(x).flatten(2).transpose(1, 2)).mean(1))
m = M(); opt = torch.optim.AdamW(m.parameters(), 1e-3)
g = torch.Generator().manual_seed(1)
x = torch.randn(16, 3, 32, 32, generator=g); y = torch.randint(0, 3, (16,), generator=g)
for _ in range(5):
    loss = torch.nn.functional.cross_entropy(m(x), y); opt.zero_grad(); loss.backward(); opt.step()
from lib.compendium import numerics
print(json.dumps({"bits": hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in m.parameters())).hexdigest(),
                  "capability": torch.backends.cpu.get_cpu_capability(), "onednn": torch.backends.mkldnn.enabled,
                  "threads": torch.get_num_threads(), "problems": numerics.check()}))
"""


def _run(extra: dict[str, str], drop=()) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in numerics.PINNED_ENV and k not in drop}
    env.update(extra)
    out = subprocess.run([sys.executable, "-c", TRAIN], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_pinned_env_adds_every_choice_keeps_a_users_own_and_native_adds_none():
    env = numerics.pinned_env({"PATH": "/bin"})
    assert all(env[k] == v for k, v in numerics.PINNED_ENV.items())
    assert numerics.pinned_env({"MKL_CBWR": "COMPATIBLE"})["MKL_CBWR"] == "COMPATIBLE"
    native = numerics.pinned_env({numerics.MODE_ENV: "native"})
    assert not set(numerics.PINNED_ENV) & set(native)
    with pytest.raises(ValueError, match=numerics.MODE_ENV):
        numerics.mode({numerics.MODE_ENV: "fast"})


def test_every_notebook_kernel_starts_pinned(monkeypatch):
    for k in numerics.PINNED_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.delenv(numerics.MODE_ENV, raising=False)
    env = run_env()
    assert all(env[k] == v for k, v in numerics.PINNED_ENV.items())


def test_a_process_that_imports_lib_runs_torch_pinned_and_trains_the_same_bits_whatever_the_native_hints():
    pinned = _run({})
    assert pinned["problems"] == []
    assert pinned["capability"] in ("AVX2", "DEFAULT") and pinned["onednn"] is False
    assert pinned["threads"] == numerics.PINNED_THREADS
    # hints that steer a library towards the widest instructions when it chooses for itself (oneDNN's older name
    # for its cap; MKL's own cap unset, as in most shells): the pinned choices outrank them
    hinted = _run({"DNNL_MAX_CPU_ISA": "AVX512_CORE", "MKL_DEBUG_CPU_TYPE": "5"})
    assert hinted["bits"] == pinned["bits"] and hinted["problems"] == []
    # a user's own value of a pinned variable is kept (an AVX-512 Intel CPU then trains other bits) and named
    own = _run({"MKL_ENABLE_INSTRUCTIONS": "AVX512"})
    assert own["problems"] == ["MKL_ENABLE_INSTRUCTIONS='AVX512' (pinned: 'AVX2')"]
    native = _run({numerics.MODE_ENV: "native"})
    assert native["onednn"] is True and native["problems"] == []


def test_threads_setting_is_checked(monkeypatch):
    monkeypatch.setenv(numerics.THREADS_ENV, "0")
    with pytest.raises(ValueError, match=numerics.THREADS_ENV):
        numerics.threads()


def test_the_paper_profile_on_a_gpu_machine_runs_native_unless_asked(monkeypatch):
    """On a machine with a visible GPU the paper profile's stages (and a profile extending it) run with the
    libraries' own CPU choices; the CPU-trained profiles stay pinned; a user's COMPENDIUM_CPU_NUMERICS wins."""
    from lib.compendium import stages
    monkeypatch.delenv(numerics.MODE_ENV, raising=False)
    monkeypatch.setattr(numerics, "SET_HERE", {"ATEN_CPU_CAPABILITY"})
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    monkeypatch.setattr(numerics, "gpu_visible", lambda env=None: True)
    env = stages.run_env("paper")
    assert env[numerics.MODE_ENV] == "native" and "ATEN_CPU_CAPABILITY" not in env
    for p in ("embedded", "ci", None):
        assert stages.run_env(p).get(numerics.MODE_ENV, "pinned") == "pinned", p
    monkeypatch.setenv(numerics.MODE_ENV, "pinned")
    assert stages.run_env("paper")[numerics.MODE_ENV] == "pinned"
    monkeypatch.delenv(numerics.MODE_ENV)
    monkeypatch.setattr(numerics, "gpu_visible", lambda env=None: False)
    assert stages.run_env("paper").get(numerics.MODE_ENV, "pinned") == "pinned"


def test_no_visible_gpu_when_cuda_visible_devices_hides_them():
    assert numerics.gpu_visible({"CUDA_VISIBLE_DEVICES": "-1"}) is False
    assert numerics.gpu_visible({"CUDA_VISIBLE_DEVICES": ""}) is False
