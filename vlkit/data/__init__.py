"""Data: the embedded shapes world, readers of the official formats, tokenizers, pair datasets, collators
and dynamic batching. Importing this package registers the built-in datasets in `DATASETS`."""
from vlkit.data.batching import FixedSizeBatchSampler, TokenBucketSampler, padded_units, padding_fraction
from vlkit.data.formats import FormatError
from vlkit.data.collate import VLCollator
from vlkit.data.images import FolderImages, PixelSource, RegionSource, build_image_source
from vlkit.data.pairs import ImageTextPairs, build_pairs
from vlkit.data.shapes import ShapesWorld, shapes_tokenizer, write_shapes
from vlkit.data.stream import StreamedPairs
from vlkit.data.tokenizers import TokenizerError, build_tokenizer
from vlkit.data import datasets  # noqa: F401,E402  (register the built-in datasets: the home of vlkit.DATASETS)

__all__ = [
    "FixedSizeBatchSampler", "TokenBucketSampler", "padded_units", "padding_fraction", "FormatError",
    "FolderImages", "ImageTextPairs", "PixelSource", "RegionSource", "VLCollator", "build_image_source",
    "build_pairs", "build_tokenizer", "ShapesWorld", "shapes_tokenizer", "write_shapes", "StreamedPairs",
    "TokenizerError",
]
