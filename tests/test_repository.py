"""What the repository tracks: no symbolic link (a clone gets the link, not what it pointed to: a tracked
`.venv` link replaced the clone's virtual environment and a checkout deleted the real one) and nothing that
.gitignore names (an ignored path that is tracked anyway is a build output or a local file committed by
mistake)."""
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str) -> list[str]:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if line.strip()]


def test_no_tracked_file_is_a_symbolic_link():
    links = [line.split("\t", 1)[1] for line in _git("ls-files", "-s") if line.startswith("120000 ")]
    assert links == [], f"tracked symbolic links: {links}"


def test_nothing_gitignore_names_is_tracked():
    assert _git("ls-files", "-ci", "--exclude-standard") == []
