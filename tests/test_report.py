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


def test_every_local_link_of_the_readme_and_docs_resolves_in_the_site(tmp_path):
    """The README's links to docs/*.md, and the docs' links to each other and to files of the repository, lead to a
    page or file of the site (the docs are rendered; other linked files copied): none is dropped or left dangling."""
    import re
    from urllib.parse import urlsplit
    site = tmp_path / "site"
    report.build("embedded", site)
    assert report.broken_links(site) == []
    sources = [report.ROOT / "README.md", *sorted((report.ROOT / "docs").glob("*.md"))]
    local = 0
    for md in sources:
        page = site / report.site_page(md.relative_to(report.ROOT).as_posix())
        html_text = page.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)\s]+)\)", md.read_text(encoding="utf-8")):
            parts = urlsplit(target)
            if parts.scheme or target.startswith("#"):
                continue
            local += 1
            dest = (md.parent / parts.path).resolve().relative_to(report.ROOT).as_posix()
            want = report.site_page(dest) or dest
            linked = {(page.parent / h.split("#")[0]).resolve() for h in re.findall(r'href="([^"#][^"]*)"', html_text)}
            assert (site / want).resolve() in linked, (md.name, target)
    assert local >= 11                                      # the README's links to docs/ among them


def test_a_link_to_nowhere_is_reported(tmp_path):
    site = tmp_path / "s"
    (site / "docs").mkdir(parents=True)
    (site / "index.html").write_text('<a href="docs/x.html">x</a><a href="https://example.org/y">y</a><a href="#top">t</a>')
    assert report.broken_links(site) == ["index.html: docs/x.html"]
