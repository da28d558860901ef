"""Fixtures of the reliability catalogue (helpers: reliability_helpers.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
from reliability_helpers import FEAT, captions, raw_store, regions


@pytest.fixture
def data(tmp_path):
    """``data(n=6, soft=True, **bad)``: a valid raw store of ``n`` images plus 3 captions each; returns
    (store, captions, image ids)."""

    def make(n: int = 6, soft: bool = True, name: str = "store.h5", feat: int = FEAT, extra_captions=()):
        images = {f"img{k}": regions(k, soft=soft, feat=feat) for k in range(n)}
        store = raw_store(tmp_path / name, images)
        caps = captions(tmp_path / f"{Path(name).stem}.jsonl", list(images), extra=extra_captions)
        return store, caps, list(images)

    return make


@pytest.fixture
def vlkit_console(capsys):
    """``vlkit_console(*args) -> (exit status, stdout, stderr)``: the console script, in-process."""
    from vlkit.cli import console

    def run(*args: str, debug: bool = False):
        import os

        old = os.environ.pop("VLKIT_DEBUG", None)
        if debug:
            os.environ["VLKIT_DEBUG"] = "1"
        try:
            code = console(list(args))
        finally:
            os.environ.pop("VLKIT_DEBUG", None)
            if old is not None:
                os.environ["VLKIT_DEBUG"] = old
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


@pytest.fixture(scope="session")
def shapes_detector():
    from vlkit.features.detector import load_detector

    return load_detector("shapes")


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.fixture(autouse=True)
def quiet_hf(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
