"""Write the comparison tables of the documentation from real runs, so that every figure there can be
regenerated.

    python scripts/readme_tables.py default             # runs `vlkit compare` (cold cache), then updates its page
    python scripts/readme_tables.py claims              # the same for compare=claims
    python scripts/readme_tables.py default --from outputs/readme/default   # reuse a finished run's results

Each comparison's block lies on its own page, ``docs/compare-<NAME>.md``, between ``<!-- BEGIN compare:NAME -->``
and ``<!-- END compare:NAME -->``, and holds the command, the wall time of the whole command (cold feature
cache unless ``--cache-dir`` is given), the git commit and the report `vlkit compare` wrote (``results.md``
without its title). The comparison's ``metrics.png`` is copied beside the page, to
``docs/compare_<NAME>_metrics.png``.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def page(name: str) -> Path:
    """The documentation page that holds comparison ``name``'s block."""
    return DOCS / f"compare-{name}.md"


def run_comparison(name: str, output: Path, cache_dir: Path | None) -> float:
    """``vlkit compare compare=NAME`` into ``output``; the wall time of the whole command."""
    cache = cache_dir or Path(tempfile.mkdtemp(prefix="vlkit-readme-cache-"))  # cold: extraction included
    command = [sys.executable, "-m", "vlkit.cli", "compare", f"compare={name}", f"output_dir={output}",
               f"cache_dir={cache}"]
    start = time.perf_counter()
    subprocess.run(command, check=True, cwd=ROOT)
    wall = time.perf_counter() - start
    if cache_dir is None:
        shutil.rmtree(cache, ignore_errors=True)
    return wall


def block(name: str, output: Path, wall: float | None) -> str:
    manifest = json.loads((output / "manifest.json").read_text())
    report = (output / "results.md").read_text().split("\n", 2)[2].strip()  # without the title line
    report = re.sub(r"^#+ ", "## ", report, flags=re.M)  # sections of the page
    wall_text = f"{wall:.0f} s wall for the whole command" if wall is not None else \
        f"{manifest['wall_s']:.0f} s of comparison (reused results)"
    figure = f"compare_{name}_metrics.png"  # beside the page
    return "\n".join([
        f"`vlkit compare compare={name}`: {wall_text}, commit `{(manifest.get('git_commit') or 'unknown')[:12]}`, "
        f"torch {manifest['packages'].get('torch')}, written by `python scripts/readme_tables.py {name}`.", "",
        report, "", f"![{name} metrics]({figure})"])


def update_page(name: str, text: str) -> None:
    begin, end = f"<!-- BEGIN compare:{name} -->", f"<!-- END compare:{name} -->"
    path = page(name)
    current = path.read_text(encoding="utf-8") if path.is_file() else ""
    if begin not in current or end not in current:
        raise SystemExit(f"{path.relative_to(ROOT)} has no {begin} ... {end} block")
    head, rest = current.split(begin, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{begin}\n{text}\n{end}{tail}", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", help="a comparison preset: default, claims, ...")
    parser.add_argument("--from", dest="source", type=Path, help="a finished comparison's output_dir to reuse")
    parser.add_argument("--output", type=Path, help="where to run the comparison (default: outputs/readme/NAME)")
    parser.add_argument("--cache-dir", type=Path, help="a feature cache to reuse (default: a cold, temporary one)")
    args = parser.parse_args()
    if args.source:
        output, wall = args.source, None
    else:
        output = args.output or ROOT / "outputs" / "readme" / args.name
        if output.exists():
            raise SystemExit(f"{output} exists: pass --from {output} to reuse it, or remove it")
        wall = run_comparison(args.name, output, args.cache_dir)
    update_page(args.name, block(args.name, output, wall))
    shutil.copyfile(output / "metrics.png", DOCS / f"compare_{args.name}_metrics.png")
    print(f"{page(args.name).relative_to(ROOT)}: compare:{args.name} block written from {output}")


if __name__ == "__main__":
    main()
