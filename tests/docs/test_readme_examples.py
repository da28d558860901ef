"""Issue 21: every example of the README and of the documentation pages marked runnable runs as pasted.

A fenced block preceded by ``<!-- runnable -->`` is run: ``python`` blocks with the Python that runs the
tests, ``bash`` blocks with bash (``set -euo pipefail``). ``<!-- runnable: file PATH -->`` writes the block
to ``PATH`` instead (a YAML file, a plugin's module ...), for the blocks after it. The blocks of one page
run in order in one temporary folder, with a private Python environment on top of the test one (so that a
``pip install`` in a block installs there, offline, and is gone afterwards) and a private feature cache.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKED = re.compile(r"^<!-- runnable(?:: file (?P<file>\S+))? -->\n```(?P<lang>\w+)\n(?P<code>.*?)^```$", re.M | re.S)
RUN = {"python": "python", "bash": "bash", "sh": "bash", "shell": "bash"}


def marked_blocks(page: Path) -> list[tuple[str | None, str, str]]:
    """``(file or None, language, code)`` of each block marked runnable, in page order."""
    text = page.read_text(encoding="utf-8")
    blocks = [(m["file"], m["lang"], m["code"]) for m in MARKED.finditer(text)]
    assert text.count("<!-- runnable") == len(blocks), f"{page.name}: a runnable marker not right before a fence"
    for file, lang, _ in blocks:
        assert file or lang in RUN, f"{page.name}: cannot run a {lang} block"
    return blocks


def private_environment(folder: Path) -> dict[str, str]:
    """A virtual environment in ``folder/env`` that sees every package of the test environment, with
    ``python``, ``pip`` and ``vlkit`` on PATH running in it; pip offline, without build isolation."""
    import site

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder / "env")], check=True)
    bin_dir = folder / "env" / "bin"
    purelib = subprocess.run([str(bin_dir / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    outer = [*site.getsitepackages(), sysconfig.get_paths()["purelib"]]
    Path(purelib, "_test_environment.pth").write_text(
        "import site; " + "; ".join(f"site.addsitedir({p!r})" for p in dict.fromkeys(outer)) + "\n")
    for name, module in (("pip", "pip"), ("vlkit", "vlkit.cli")):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec "{bin_dir / "python"}" -m {module} "$@"\n')
        (bin_dir / name).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "VIRTUAL_ENV": str(folder / "env"),
            "PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "VLKIT_CACHE": str(folder / "cache"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def test_runnable_blocks_are_found():
    runnable = {page.name: marked_blocks(page) for page in PAGES}
    assert len(runnable["README.md"]) >= 2 and runnable["compare.md"] and runnable["plugins.md"]


# docs/python.md runs as .py files and as one notebook in test_python_page.py (its blocks pasted into files:
# stricter than ``python -c``, whose worker processes cannot import the block), not a third time here
AS_SCRIPTS = {ROOT / "docs" / "python.md"}


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in PAGES if marked_blocks(p) and p not in AS_SCRIPTS], ids=lambda p: p.name)
def test_every_runnable_block_runs_as_pasted(page, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    env = private_environment(tmp_path)
    for i, (file, lang, code) in enumerate(marked_blocks(page)):
        if file:
            (work / file).parent.mkdir(parents=True, exist_ok=True)
            (work / file).write_text(code, encoding="utf-8")
            continue
        command = ["python", "-c", code] if RUN[lang] == "python" else ["bash", "-euo", "pipefail", "-c", code]
        proc = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{page.name}, runnable block {i + 1} ({lang}) failed:\n{code}\n" \
                                     f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"


def test_the_readmes_links_into_the_documentation_resolve():
    """`mkdocs build --strict` checks the pages' own links; the README's links into docs/ are checked here."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#([^)\s]+))?\)", readme)
    assert len(links) >= 10
    for target, anchor in links:
        page = ROOT / target
        assert page.is_file(), f"README.md links to {target}, which does not exist"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), flags=re.M)
            slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}
            assert anchor in slugs, f"README.md links to {target}#{anchor}, which has no such heading"
