"""API keys: NAME, NAME_1, NAME_2... from the environment or a git-ignored env file, rotated."""
from __future__ import annotations

import itertools
import os
import threading
from pathlib import Path
from typing import Sequence

from lib import ROOT
from lib.compendium.artifacts import write_text


def read_dotenv(path: str | Path) -> dict[str, str]:
    """KEY=VALUE lines of a .env file (comments and `export ` allowed; quotes stripped)."""
    out: dict[str, str] = {}
    p = Path(path)
    if not p.exists():
        return out
    for line in p.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        if line.startswith("export "):
            line = line[len("export "):]
        k, v = line.split("=", 1)
        out[k.strip()] = v.strip().strip("'\"")
    return out


#: Every env file other than the project's `.env` that keys were read from, one absolute path a line:
#: the notebook scrubber (lib.compendium.stages) redacts their secrets too, since it runs in another process.
ENV_FILES_LOG = ROOT / "artifacts" / ".env_files"


def remembered_env_files() -> list[Path]:
    try:
        return [Path(line) for line in ENV_FILES_LOG.read_text(encoding="utf-8").splitlines() if line.strip()]
    except OSError:
        return []


def _remember_env_file(path: str | Path) -> None:
    p = Path(path).resolve()
    if p == (ROOT / ".env").resolve() or p in remembered_env_files():
        return
    write_text(ENV_FILES_LOG, "".join(f"{f}\n" for f in [*remembered_env_files(), p]))


def api_keys(name: str, env_file: str | Path | None = None) -> list[str]:
    """NAME, then NAME_1, NAME_2, ... from the environment, falling back to `.env` (or `env_file`,
    which is then remembered so that saved notebooks are scrubbed of its secrets too)."""
    if env_file is not None:
        _remember_env_file(env_file)
    env = {**read_dotenv(env_file if env_file is not None else ROOT / ".env"), **os.environ}
    keys = [env[name]] if env.get(name) else []
    i = 1
    while env.get(f"{name}_{i}"):
        keys.append(env[f"{name}_{i}"])
        i += 1
    return list(dict.fromkeys(keys))


class KeyRing:
    """Round-robin over API keys; a key the server rejects (401/403) is retired."""

    def __init__(self, keys: Sequence[str]):
        self._keys = list(keys)
        self._dead: set[str] = set()
        self._cycle = itertools.cycle(range(len(self._keys))) if self._keys else None
        self._lock = threading.Lock()

    def next(self) -> str | None:
        with self._lock:
            if not self._keys:
                return None
            for _ in range(len(self._keys)):
                k = self._keys[next(self._cycle)]
                if k not in self._dead:
                    return k
            return None

    def retire(self, key: str) -> None:
        with self._lock:
            self._dead.add(key)

    @property
    def alive(self) -> int:
        return len([k for k in self._keys if k not in self._dead])
