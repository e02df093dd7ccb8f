"""The report renders hostile notebooks and file names without running anything, and touches only
the files it writes."""
import stat
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import nbformat
import pytest

from lib.compendium import report

PAYLOADS = ['<script>alert("pwn1")</script>', '<img src=x onerror=alert("pwn2")>', '<a href="javascript:alert(\'pwn3\')">go</a>',
            '<svg onload=alert("pwn4")></svg>', '<iframe src="javascript:alert(\'pwn5\')"></iframe>',
            '<a href="data:text/html,<script>alert(\'pwn6\')</script>">d</a>', '<body onload=alert("pwn7")>',
            '<style>body{background:url("javascript:alert(\'pwn8\')")}</style>', '<object data="pwn9.swf"></object>',
            '<math><mi xlink:href="javascript:alert(\'pwn10\')">m</mi></math>']


class Dom(HTMLParser):
    """Every script's text, every attribute, from a page."""

    def __init__(self):
        super().__init__()
        self.scripts, self.attrs, self._in_script = [], [], False

    def handle_starttag(self, tag, attrs):
        self.attrs += [(tag, k, v or "") for k, v in attrs]
        self._in_script = tag == "script"

    def handle_endtag(self, tag):
        self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.scripts.append(data)


def dom(path: Path) -> Dom:
    d = Dom()
    d.feed(path.read_text(encoding="utf-8"))
    return d


def hostile_notebook(path: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_markdown_cell("# Hostile\n\nA blurb " + PAYLOADS[0] + "\n\n" + "\n\n".join(PAYLOADS)))
    code = nbformat.v4.new_code_cell("x = 1")
    code.outputs = [nbformat.v4.new_output("display_data", {"text/html": "".join(PAYLOADS), "text/plain": "x"}),
                    nbformat.v4.new_output("display_data", {"application/javascript": 'alert("pwn11")'}),
                    nbformat.v4.new_output("display_data", {"text/markdown": PAYLOADS[1] + PAYLOADS[2]}),
                    nbformat.v4.new_output("display_data", {"text/html": "<table><thead><tr><th>metric</th></tr>"
                                                                          "</thead><tbody><tr><td>0.5</td></tr>"
                                                                          "</tbody></table>"})]
    nb.cells.append(code)
    nbformat.write(nb, str(path))
    return path


FIGURE_NAMES = ['q" onerror="alert(\'f1\')', "hash#part", "pct%41done", "space name", "<i>tag", "amp&lt;"]


@pytest.fixture
def site(tmp_path, monkeypatch):
    root = tmp_path / "root"
    figs = root / "artifacts" / "demo" / "figures"          # an unpublished profile's figures and their index
    figs.mkdir(parents=True)
    (root / "README.md").write_text("# Readme\n\n" + PAYLOADS[0] + "\n\n| metric | value |\n|---|---|\n| acc | 1 |\n")
    (figs / "README.md").write_text("# Figures\n\n" + PAYLOADS[1] + "\n")
    from PIL import Image
    for name in FIGURE_NAMES:
        Image.new("RGB", (4, 4)).save(figs / f"{name}.png")
    nb = hostile_notebook(tmp_path / "01_hostile.ipynb")
    monkeypatch.setattr(report, "ROOT", root)
    monkeypatch.setattr(report, "notebooks", lambda profile: [nb])
    out = tmp_path / "out"
    out.mkdir()
    key, script = out / "secret.key", out / "run.sh"
    key.write_text("k")
    key.chmod(0o600)
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    return out, key, script


def _no_attack(page: Path, marker_ids):
    d = dom(page)
    for s in d.scripts:
        for m in marker_ids:
            assert m not in s, (page.name, s[:200])
    for tag, k, v in d.attrs:
        assert not k.startswith("on"), (page.name, tag, k, v)
        assert not v.strip().lower().startswith(("javascript:", "data:text")), (page.name, tag, k, v)
        assert tag not in ("iframe", "object", "embed", "svg", "math"), (page.name, tag)


def test_hostile_outputs_markdown_and_names_are_rendered_inert(site):
    out, key, script = site
    index = report.build("demo", out)
    markers = [f"pwn{i}" for i in range(1, 12)] + ["f1"]
    for page in (index, out / "01_hostile.html", out / "figures.html"):
        _no_attack(page, markers)
    page = (out / "01_hostile.html").read_text()
    assert "<th>metric</th>" in page and "<td>0.5</td>" in page          # tables survive the sanitiser
    # figure links: percent-encoded, attribute-safe, and each resolves to the file written
    srcs = [v for tag, k, v in dom(out / "figures.html").attrs if tag == "img" and k == "src"]
    assert len(srcs) == len(FIGURE_NAMES)
    for src in srcs:
        assert "#" not in src and '"' not in src and (out / unquote(src)).is_file(), src


def test_the_report_touches_only_its_own_files(site):
    out, key, script = site
    report.build("demo", out)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600                    # a private key stays private
    assert stat.S_IMODE(script.stat().st_mode) == 0o755                 # a script keeps its run bit
    assert stat.S_IMODE((out / "index.html").stat().st_mode) == 0o644


def test_trust_html_is_the_named_way_to_render_a_notebooks_own_scripts(site):
    out, _, _ = site
    report.build("demo", out, trust_html=True)
    assert any("pwn11" in s for s in dom(out / "01_hostile.html").scripts)


@pytest.mark.parametrize("fragment,kept,dropped", [
    ('<img src="data:image/png;base64,iVBORw0KGgo=">', 'src="data:image/png;base64,iVBORw0KGgo="', None),
    ('<img src="data:image/svg+xml;base64,PHN2Zz4=">', "<img", "svg+xml"),
    ('<a href="https://example.org/a?b=c">l</a>', 'href="https://example.org/a?b=c"', None),
    ('<a href=" JaVaScRiPt:alert(1)">l</a>', "<a>l</a>", "alert"),
    ('<p style="color:red" onclick="x()">t</p>', "<p>t</p>", "onclick"),
])
def test_sanitize_html_allow_list(fragment, kept, dropped):
    out = report.sanitize_html(fragment)
    assert kept in out and (dropped is None or dropped not in out)


@pytest.mark.parametrize("name", ["../artifacts/x", "/tmp/site", "a/b", "..", "x/../../y", ""])
def test_the_report_takes_only_plain_profile_names(name, capsys):
    """`--profile` names a profile, never a path: nothing is written outside artifacts/<profile>/."""
    from lib.compendium.params import ProfileError
    with pytest.raises(ProfileError, match="not a plain name"):
        report.build(name)
    assert report.main(["--profile", name]) == 2
    assert "not a plain name" in capsys.readouterr().err
