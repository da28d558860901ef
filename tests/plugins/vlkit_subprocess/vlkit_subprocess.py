"""``compare.executor=subprocess``: each unit of a comparison in a fresh ``python -m vlkit.compare.worker PLAN KEY``
process, at most ``compare.subprocess.max_parallel`` at once. An executor from outside vlkit: one class and its
``compare.subprocess`` block, found through the ``vlkit.plugins`` entry point."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

from vlkit import Executor, register_executor
from vlkit.compare.executors import outcome_on_disk


@register_executor("subprocess")
class SubprocessExecutor(Executor):
    config = {"max_parallel": None, "python": None, "env": {}}
    notes = {"max_parallel": "units at once (default: workers)",
             "python": "the interpreter that runs a unit (default: this one)",
             "env": "environment variables of each unit's process"}
    resume_safe = ("max_parallel",)  # another interpreter or environment may compute otherwise: a resume refuses them

    @classmethod
    def check(cls, settings: Any) -> None:
        python = settings.block("subprocess")["python"]
        if python and not os.access(python, os.X_OK):
            raise FileNotFoundError(f"compare.subprocess.python={python}: no such executable")

    @classmethod
    def planned_slots(cls, settings: Any) -> int:
        return int(settings.block("subprocess")["max_parallel"] or settings.workers)

    @classmethod
    def estimate_line(cls, settings: Any, wall_hours: Any) -> str:
        n = cls.planned_slots(settings)
        return f"- executor subprocess: {n} fresh process(es) at once -> about {wall_hours(n)} h wall"

    def __init__(self, plan_path: Any, settings: Any):
        super().__init__(plan_path, settings)
        self.slots = self.planned_slots(settings)
        self.env = {**os.environ, **{str(k): str(v) for k, v in (self.options["env"] or {}).items()}}
        self.running: dict[str, subprocess.Popen] = {}

    def submit(self, key: str) -> None:
        command = [self.options["python"] or sys.executable, "-m", "vlkit.compare.worker", self.plan_path, key]
        self.running[key] = subprocess.Popen(command, env=self.env, stdout=subprocess.DEVNULL)

    def wait(self, timeout: float) -> list[tuple[str, dict[str, Any]]]:
        deadline = time.monotonic() + timeout
        while True:
            ended = [key for key, process in self.running.items() if process.poll() is not None]
            if ended or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        out = []
        for key in ended:
            code = self.running.pop(key).returncode
            out.append((key, outcome_on_disk(self.plan_path, key, f"unit process exited with {code}")))
        return out

    def close(self) -> None:
        for process in self.running.values():
            process.terminate()
        for process in self.running.values():
            process.wait(30)
