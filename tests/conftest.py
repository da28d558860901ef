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

FAMILIES = ("vilbert", "uniter", "meter")


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
