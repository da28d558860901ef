"""The released files the converters take, where their publishers give them, and the check every file
passes before it is read: an empty file, or a known file whose size or sha256 differs from the
publisher's, is refused naming its path (a truncated download otherwise fails deep inside
``torch.load`` without saying which file).

`RELEASED_FILES` is a registry keyed by file name: each family's released files are in its recipe
(`vlkit.models.recipe.Recipe.released`, beside its model file), the detector's below; a plugin (or a user with a
mirror that publishes checksums) adds entries with `register_released_file`. Sizes and hashes are filled in only where the
publisher gives them: none of the official READMEs below does, so today only the emptiness check and
the readers' own errors apply to them. `PRETRAINED` names the released weights (``uniter/base.official``,
declared by the family's recipe) that ``build_model(family, pretrained=tag)`` loads once converted. `ConversionReport` is what every converter (the families' and the
detector's) says happened to each key of a released file.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from vlkit.io import sha256_file
from vlkit.registry import Registry, UnknownNameError, did_you_mean


@dataclass(frozen=True)
class ReleasedFile:
    """One file as its publisher releases it."""

    name: str  # the released file name
    family: str  # vilbert | uniter | meter | detector
    what: str  # what it holds and which `vlkit convert` argument takes it
    source: str  # the download URL or source page, as the official README gives it
    origin: str  # where that is written (repository and file)
    size: int | None = None  # bytes, where the publisher gives it
    sha256: str | None = None  # hex digest, where the publisher gives it


@dataclass
class ConversionReport:
    """What happened to every key of a converted checkpoint."""

    source: str
    format: str
    mapped: int = 0
    renamed: list[tuple[str, str]] = field(default_factory=list)
    transformed: list[str] = field(default_factory=list)
    filled: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)

    def __str__(self) -> str:
        lines = [
            f"{self.source} ({self.format}): {self.mapped} tensors loaded, {len(self.renamed)} renamed, "
            f"{len(self.transformed)} transformed, {len(self.filled)} filled, {len(self.ignored)} ignored"
        ]
        for title, items in (("transformed", self.transformed), ("filled", self.filled), ("missing", self.missing),
                             ("unexpected", self.unexpected), ("shape mismatch", self.mismatched)):
            if items:
                shown = ", ".join(map(str, items[:8])) + (f", ... ({len(items)} in all)" if len(items) > 8 else "")
                lines.append(f"  {title}: {shown}")
        return "\n".join(lines)


RELEASED_FILES = Registry("released file")


def register_released_file(entry: ReleasedFile, override: bool = False) -> ReleasedFile:
    return RELEASED_FILES.register(entry.name, override=override)(entry)


@dataclass(frozen=True)
class PretrainedWeights:
    """A named release of a family's weights, ``<family>/<tag>`` (``uniter/base.official``; timm's ``arch.tag``):
    the released ``file`` (a `ReleasedFile` name) and how `vlkit convert` turns it into a vlkit run (``task``, the
    official ``config`` file it reads). ``build_model(family, pretrained=tag)`` loads the converted run from
    `pretrained_dir` (nothing is downloaded); ``vlkit convert pretrained=<name> src=<file>`` writes it there."""

    family: str
    tag: str  # <preset>.<source>: base.official, large.official, clip16-roberta.288 ...
    file: str
    what: str
    task: str | None = None  # the convert task= (None: the heads of the file decide)
    config: str | None = None  # the official config file convert reads (config=), when the file needs one

    @property
    def name(self) -> str:
        return f"{self.family}/{self.tag}"

    @property
    def directory(self) -> Path:
        """Where the converted run of these weights lives: ``pretrained_dir()/<family>/<tag>``."""
        return pretrained_dir() / self.family / self.tag

    @property
    def converted(self) -> bool:
        return (self.directory / "model" / "config.json").is_file()

    def convert_command(self) -> str:
        config = f" config={self.config}" if self.config else ""
        return f"vlkit convert pretrained={self.name} src={self.file}{config}"


PRETRAINED = Registry("pretrained weights")


def register_pretrained(entry: PretrainedWeights, override: bool = False) -> PretrainedWeights:
    return PRETRAINED.register(entry.name, override=override)(entry)


def pretrained_dir() -> Path:
    """The folder of converted named weights: ``$VLKIT_WEIGHTS``, else ``$VLKIT_CACHE/weights``, else
    ``~/.cache/vlkit/weights``."""
    if os.environ.get("VLKIT_WEIGHTS"):
        return Path(os.environ["VLKIT_WEIGHTS"])
    return Path(os.environ.get("VLKIT_CACHE") or Path.home() / ".cache" / "vlkit") / "weights"


def pretrained_weights(family: str, tag: str) -> PretrainedWeights:
    """The named release ``<family>/<tag>`` (an unknown tag lists the family's)."""
    name = f"{family}/{tag}"
    if name not in PRETRAINED:
        tags = [n.split("/", 1)[1] for n in PRETRAINED.names() if n.startswith(f"{family}/")]
        raise UnknownNameError(f"no pretrained weights {tag!r} for {family}{did_you_mean(tag, tags)}; {family} has: "
                               f"{', '.join(tags) or '(none)'} (vlkit.list_pretrained())")
    return PRETRAINED.get(name)


def known_file(name: str) -> ReleasedFile | None:
    return RELEASED_FILES.get(name) if name in RELEASED_FILES else None


def check_released(path: str | os.PathLike, what: str = "file") -> Path:
    """``path`` if it exists, is not empty and, when its name is a known release with a published size or
    sha256, has them; otherwise `ValueError` (`FileNotFoundError` when absent) naming the path."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: {what} not found")
    known = known_file(path.name)
    again = f"; download it again from {known.source}" if known else ""
    size = path.stat().st_size
    if size == 0:
        raise ValueError(f"{path}: the {what} is empty (0 bytes){again}")
    if known and known.size is not None and size != known.size:
        raise ValueError(f"{path}: {size:,} bytes where the released {known.name} has {known.size:,} "
                         f"(truncated or another file){again}")
    if known and known.sha256 is not None and sha256_file(path) != known.sha256.lower():
        raise ValueError(f"{path}: sha256 differs from the released {known.name}'s {known.sha256}{again}")
    return path


# the detector's releases (the families' own are in their recipes, `vlkit.models.recipe`)
for _entry in (
    ReleasedFile("faster_rcnn_from_caffe_attr.pkl", "detector",
                 "BUTD Faster R-CNN R101 with attributes, converted from Caffe (`detector=butd weights=`)",
                 "https://nlp1.cs.unc.edu/models/faster_rcnn_from_caffe_attr.pkl",
                 "airsplay/py-bottom-up-attention README.md"),
    ReleasedFile("bua-caffe-frcn-r101-k10-100.pth", "detector",
                 "BUTD Faster R-CNN R101, K=[10,100], converted from Caffe (`detector=butd weights=`)",
                 "https://awma1-my.sharepoint.com/:u:/g/personal/yuz_l0_tn/EaXvCC3WjtlLvvEfLr3oa8UBLA21tcLh4L8YLbYXl6jgjg?e=SFMoeu",
                 "MILVLG/bottom-up-attention.pytorch README.md (Pre-trained models)"),
):
    register_released_file(_entry)
