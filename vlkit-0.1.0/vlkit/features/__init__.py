"""Region features (bottom-up-attention detector, h5 store, importers) and the ViT pixel pipeline.

Submodules load on first use so that ``import vlkit.features`` stays light.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BottomUpDetector": "detector", "DetectorConfig": "detector", "load_detector": "detector",
    "extract_features": "detector", "butd_select": "detector",
    "FeatureStore": "store", "FeatureStoreWriter": "store", "FeatureStoreError": "store", "Regions": "store",
    "build_index": "shards", "merge_shards": "shards", "shard_of": "shards",
    "import_features": "importers", "IMPORT_FORMATS": "importers",
    "pixel_transform": "patches", "pixel_values": "patches", "patch_grid": "patches",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'vlkit.features' has no attribute {name!r}")
    return getattr(importlib.import_module(f"vlkit.features.{_EXPORTS[name]}"), name)


__all__ = sorted(_EXPORTS)
