"""Shared test settings: quiet third-party warnings, deterministic CPU math, tiny presets."""
import os
import warnings

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore", category=UserWarning)
warnings.filterwarnings("ignore", category=FutureWarning)
# Tiny models gain nothing from intra-op threads, and on a busy 2-core machine spinning threads make
# them many times slower: the whole suite runs single-threaded.
torch.set_num_threads(1)


def pytest_configure(config):
    """CI tests the installed wheel: ``VLKIT_FORBID_SOURCE=<checkout>`` fails the run if vlkit comes from there."""
    forbidden = os.environ.get("VLKIT_FORBID_SOURCE")
    if forbidden:
        from pathlib import Path

        import vlkit

        if Path(forbidden).resolve() in Path(vlkit.__file__).resolve().parents:
            raise pytest.UsageError(f"vlkit is imported from {vlkit.__file__}, inside {forbidden}, not from the "
                                    "installed package")


@pytest.hookimpl(tryfirst=True)  # before xdist's loadgroup reads the groups
def pytest_collection_modifyitems(items):
    """The suite runs on every core (pytest-xdist, ``--dist loadgroup`` in pyproject.toml) with each fixture built
    once: a test file is one group, so its module fixtures are built on one worker, and files that share a
    session fixture of a conftest (the smoke comparison) are one group too."""
    group = {}  # file -> its group's representative file

    def find(path):
        while group.setdefault(path, path) != path:
            path = group[path]
        return path

    files = [item.nodeid.split("::", 1)[0] for item in items]
    users = {}  # session fixture -> the first file using it
    for item, file in zip(items, files):
        path = find(file)
        for defs in item._fixtureinfo.name2fixturedefs.values():
            if defs[-1].scope == "session" and defs[-1].baseid:  # a conftest's, not a plugin's
                first = find(users.setdefault(defs[-1], path))
                group[path], path = first, first
    for item, file in zip(items, files):
        item.add_marker(pytest.mark.xdist_group(find(file)))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def build_tiny():
    """Factory: ``build_tiny("uniter", num_hidden_layers=2)`` -> a tiny model in eval mode."""
    import vlkit

    def make(family: str, **overrides):
        return vlkit.build_model(family, preset="tiny", **overrides).eval()

    return make


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A feature cache shared by a module's command tests (the shapes store is extracted once)."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture
def command_args():
    """``command_args(cache, out, steps=3)``: the overrides of a tiny, quick `vlkit pretrain` / `finetune`."""
    def args(cache, out, steps=3):
        return [f"cache_dir={cache}", "data.num_images=30", "model.preset=tiny", f"trainer.output_dir={out}",
                f"trainer.max_steps={steps}", "trainer.batch_size=4", "trainer.warmup=1", "trainer.progress=false",
                "trainer.trackers=[]", "trainer.lr=1e-3"]
    return args
