"""A benchmark's measurement in a fresh process: the child prints one ``RESULT <json>`` line."""
from __future__ import annotations

import json
import subprocess
from typing import Any

PREFIX = "RESULT "


def report(value: Any) -> None:
    """The child's side: print ``value`` for `run_child`."""
    print(PREFIX + json.dumps(value), flush=True)


def run_child(cmd: list[str], what: str, **kwargs: Any) -> Any:
    """Run ``cmd`` and return the value of its ``RESULT`` line; a child that fails raises with its stderr."""
    out = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    line = next((x for x in out.stdout.splitlines() if x.startswith(PREFIX)), None)
    if out.returncode or line is None:
        raise RuntimeError(f"{what}: {out.stderr[-3000:]}")
    return json.loads(line[len(PREFIX):])
