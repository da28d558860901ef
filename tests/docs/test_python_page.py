"""Issue 52: docs/python.md runs as a script and as a notebook, not only block by block with ``python -c``: each
Python block saved as a ``.py`` file and run with ``python`` (so ``vlkit.compare``'s worker processes import it:
its block carries the ``if __name__ == "__main__":`` guard), and all of them in one process, in order, as the cells
of a notebook."""
from __future__ import annotations

import subprocess

import pytest
from test_readme_examples import AS_SCRIPTS, ROOT, marked_blocks, private_environment

PAGE = ROOT / "docs" / "python.md"
assert PAGE in AS_SCRIPTS  # run here, not block by block with ``python -c`` by test_readme_examples.py
NOTEBOOK = '''import subprocess, sys
if __name__ == "__main__":  # the cells, in one interpreter; a bash cell in a shell
    for lang, code in CELLS:
        if lang == "python":
            exec(compile(code, "<cell>", "exec"), {"__name__": "__main__"})
        else:
            subprocess.run(["bash", "-euo", "pipefail", "-c", code], check=True)
'''


def test_the_page_guards_its_comparison():
    blocks = [code for _, lang, code in marked_blocks(PAGE) if lang == "python"]
    compares = [code for code in blocks if "vlkit.compare(" in code]
    assert compares and all('if __name__ == "__main__":' in code for code in compares)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["script", "notebook"])
def test_the_page_runs_as_scripts_and_as_a_notebook(mode, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    env = private_environment(tmp_path)
    blocks = [(lang, code) for file, lang, code in marked_blocks(PAGE) if not file]
    if mode == "notebook":
        (work / "notebook.py").write_text(f"CELLS = {blocks!r}\n" + NOTEBOOK, encoding="utf-8")
        runs = [["python", "notebook.py"]]
    else:
        runs = []
        for i, (lang, code) in enumerate(blocks):
            name = f"block_{i + 1}.py" if lang == "python" else f"block_{i + 1}.sh"
            (work / name).write_text(code, encoding="utf-8")
            runs.append(["python", name] if lang == "python" else ["bash", "-euo", "pipefail", name])
    for command in runs:
        proc = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=1200)
        assert proc.returncode == 0, f"{PAGE.name} as a {mode}, {command[-1]} failed:\n" \
                                     f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    assert (work / "runs" / "compare" / "results.md").is_file()
