"""`make report`: the executed notebooks as a static site, opened in headless Chromium."""
import os
import shutil
import subprocess

import pytest

from lib.compendium import report


def _chromium():
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed: `make browser` installs Debian's package (make test runs it)")
        pytest.skip("chromium is not installed (make browser)")
    return exe


def _dom(exe, page):
    r = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_the_site_renders_every_notebook_with_its_figures_and_the_results(tmp_path):
    exe = _chromium()
    index = report.build("embedded", tmp_path / "site")
    nbs = report.notebooks("embedded")
    assert len(nbs) >= 7 and [p.name for p in nbs] == sorted(p.name for p in nbs)       # notebook order
    dom = _dom(exe, index)
    assert "<h1" in dom and "MemeWorld" in dom                          # the README is the front page
    if "| system | claim |" in (report.ROOT / "README.md").read_text(encoding="utf-8"):
        assert "<table" in dom and "<th>claim</th>" in dom              # with its findings table, once published
    for p in nbs:
        assert f'href="{p.stem}.html"' in dom                           # a contents entry per notebook
    page = _dom(exe, tmp_path / "site" / "02_finetuning.html")
    assert 'src="data:image/png;base64,' in page                          # figures embedded in the page
    assert 'href="03_clip4dm.html"' in page and 'href="index.html"' in page
    figs = _dom(exe, tmp_path / "site" / "figures.html")
    assert "<img" in figs and (tmp_path / "site" / "embedded").exists()
