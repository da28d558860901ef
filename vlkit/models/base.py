"""What every family shares: the preset-aware config base, the `VLModel` base class (example
batches, caching API, save / load with safetensors) and `build_model` / `from_pretrained`."""
from __future__ import annotations

import abc
import dataclasses
import difflib
import inspect
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from vlkit.config import unwrap
from vlkit.io import WeightsMismatchError, atomic_write_text, key_difference, load_weights, save_weights
from vlkit.models import compile as blocks
from vlkit.models.recipe import recipe_of
from vlkit.registry import MODELS, RegistrationError, UnknownNameError, describe_entry, did_you_mean
from vlkit.released import known_file, pretrained_weights
from vlkit.types import Encoded, VLBatch, VLOutput
from vlkit.version import __version__

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


class UnknownFieldError(UnknownNameError, TypeError):
    """Model config keys the family's config does not have (a typo, or a key of a newer vlkit)."""

    def __init__(self, config_class: type, unknown: list[str], where: str = ""):
        fields = sorted(f.name for f in dataclasses.fields(config_class))
        named = "; ".join(f"model.{k}{did_you_mean(k, fields)}" for k in unknown)
        super().__init__(f"{where}{config_class.family} models have no field {named}; fields: {', '.join(fields)}")


@dataclasses.dataclass
class ModelConfig:
    """Base of the family configs: a dataclass whose presets are plain dicts of field values."""

    family: ClassVar[str] = ""
    presets: ClassVar[dict[str, dict[str, Any]]] = {}
    default_preset: ClassVar[str] = "base"

    preset: str = "base"

    @classmethod
    def from_preset(cls, preset: str | None = None, **overrides: Any) -> "ModelConfig":
        preset = preset or cls.default_preset
        if preset not in cls.presets:
            raise UnknownNameError(f"unknown {cls.family} preset {preset!r}{did_you_mean(preset, cls.presets)}; "
                                   f"presets: {', '.join(cls.presets)} (model.preset=)")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - fields)
        if unknown:
            raise UnknownFieldError(cls, unknown)
        return cls(**{**cls.presets[preset], **overrides, "preset": preset})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class BertStreamConfig(ModelConfig):
    """The BERT text-stream fields ViLBERT and UNITER share (names as in the official JSON configs),
    plus the region-input sizes: ``v_feature_size`` (detector feature) and ``v_target_size``
    (detector classes including background)."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    v_feature_size: int = 2048
    v_target_size: int = 1601


# The sizes the data decides, which `VLModel.size_fields` maps to the family's config fields: the tokenizer's
# vocabulary and the feature store's region feature and class dimensions.
DATA_SIZES = ("vocab_size", "region_feature_size", "region_classes")


class VLModel(nn.Module, metaclass=abc.ABCMeta):
    """Base class of the families: ``forward(batch) == fuse(encode_text(batch), encode_image(batch))``.

    The contract the rest of vlkit reads (and a new family declares):

    - ``family`` (its registry name), ``config_class`` (a `ModelConfig` dataclass with presets);
    - ``image_input``: ``"regions"`` (detector features) or ``"pixels"``; a pixel family's config has
      ``image_size`` and ``patch_size`` (read through the properties of the same names);
    - ``vocab_size``, ``text_hidden_size``, ``image_hidden_size``, ``joint_size`` and
      ``get_input_embeddings()`` (the MLM decoder ties to it when ``mlm_tied``);
    - ``size_fields``: the config fields that take the sizes the data decides (`DATA_SIZES`: the tokenizer's
      vocabulary, the feature store's region feature and class dimensions), which the commands set before
      the model is built; ``region_feature_size`` / ``region_classes`` read them back. A family whose config
      names them otherwise maps them to its own fields (HF VisualBERT's ``visual_embedding_dim``), maps a size
      it does not take to None, or answers `data_fields` when the mapping depends on the config;
    - ``image_types``: ``encode_image(batch, image_type_id=k)`` selects the image token type, and
      `extend_image_types` adds the type a second image takes (NLVR2);
    - ``task_inputs``: extra forward keywords a downstream task passes (ViLBERT's task tokens);
    - ``keeps_rows``: ``fuse`` takes ``keep_rows`` (computes the kept positions only); declared, and checked
      against ``fuse``'s signature when the family registers.

    Its task heads are registered with `vlkit.register_head`; what its official code does with the
    architecture (pre-training mix, objective defaults, trainer preset, tokenizer, RefExp rule, released
    weights) is its recipe, registered beside the model file (`vlkit.models.recipe.register_recipe`).
    """

    family: ClassVar[str] = ""
    config_class: ClassVar[type[ModelConfig]] = ModelConfig
    image_input: ClassVar[str] = "regions"  # or "pixels"
    image_types: ClassVar[bool] = False  # encode_image takes image_type_id
    mlm_tied: ClassVar[bool] = True  # the official MLM decoder is tied to the word embeddings
    encoder_prefixes: ClassVar[tuple[str, ...]] = ()  # pre-trained unimodal towers (METER's lower lr)
    image_offset: int = 0  # leading image states that are not inputs ([IMG], a ViT's [CLS]; VLOutput.image_offset)
    keeps_rows: ClassVar[bool] = False  # fuse takes keep_rows (see `fuse`)
    size_fields: ClassVar[Mapping[str, str | None]] = {
        "vocab_size": "vocab_size", "region_feature_size": "v_feature_size", "region_classes": "v_target_size"}

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config

    # -- caching API: each family implements these three ------------------------------------
    @abc.abstractmethod
    def encode_text(self, batch: VLBatch, **kwargs: Any) -> Encoded:
        """The text side up to the point where the family fuses it with the image."""

    @abc.abstractmethod
    def encode_image(self, batch: VLBatch, **kwargs: Any) -> Encoded:
        """The image side up to the point where the family fuses it with the text."""

    @abc.abstractmethod
    def fuse(self, text: Encoded, image: Encoded, pooled_only: bool = False) -> VLOutput:
        """Cross-modal layers and poolers over cached unimodal encodings.

        ``pooled_only=True`` computes the last layer of each stream only at the positions its pooler
        reads (same ``joint`` / poolers; ``text_states`` / ``image_states`` then hold those positions).

        A family may also take ``keep_rows=(text [B, T], image [B, K])``: bool masks of the token / region
        (patch) positions whose final states the caller reads (None: every position of that side); the
        last layers then compute those and the pooled positions only, and the other states come back as
        zeros at full length. The pre-training mixture passes it when the family declares ``keeps_rows``."""

    def encoding_modules(self, side: str) -> tuple[nn.Module, ...]:
        """The modules ``encode_text`` (``side="text"``) or ``encode_image`` (``"image"``) run. Training shares
        one encoding of a side between the passes of a step when none of them draws random numbers
        (dropout); the default, the whole model, never shares more than that rule allows."""
        return (self,)

    def set_activation_checkpointing(self, enabled: bool = True) -> int:
        """Recompute every transformer block's activations in the backward pass (less memory, the same
        outputs and gradients); see `vlkit.models.compile.set_activation_checkpointing`."""
        return blocks.set_activation_checkpointing(self, enabled)

    def compile_blocks(self, **options: Any) -> int:
        """``torch.compile`` every transformer block in place (`vlkit.models.compile.compile_blocks`)."""
        return blocks.compile_blocks(self, **options)

    def forward(self, batch: VLBatch, pooled_only: bool = False, **kwargs: Any) -> VLOutput:
        return self.fuse(self.encode_text(batch, **kwargs), self.encode_image(batch, **kwargs), pooled_only)

    # -- sizes the objectives and tasks read -------------------------------------------------
    @property
    def text_hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def image_hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def joint_size(self) -> int:
        return self.config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.get_input_embeddings().num_embeddings

    @classmethod
    def data_fields(cls, values: Mapping[str, Any]) -> dict[str, str]:
        """``{data size: config field}`` for the sizes of `DATA_SIZES` this family takes, given the model config
        values the user set (``values``): by default ``size_fields`` without the sizes mapped to None."""
        unknown = sorted(set(cls.size_fields) - set(DATA_SIZES))
        if unknown:
            raise TypeError(f"{cls.__name__}.size_fields: unknown data size(s) {', '.join(unknown)}; the data decides "
                            f"{', '.join(DATA_SIZES)}")
        return {size: name for size, name in cls.size_fields.items() if name is not None}

    @classmethod
    def check_contract(cls, name: str | None = None) -> None:
        """Refuse, when the family registers (`vlkit.register_model`), a declaration the commands would break on
        later: a ``config_class`` that is not a `ModelConfig` dataclass, an ``image_input`` other than regions /
        pixels, a pixel family's config without ``image_size`` / ``patch_size``, and a data size (`DATA_SIZES`: the
        vocabulary for every family, the region feature and class sizes for region families) that ``size_fields``
        maps to a field its config lacks (vlkit's defaults are BERT-stream names: ``v_feature_size`` ...).
        Raises `vlkit.registry.RegistrationError` naming the family, this contract and each problem."""
        config = cls.config_class
        problems = []
        if not (isinstance(config, type) and issubclass(config, ModelConfig) and dataclasses.is_dataclass(config)):
            problems.append(f"config_class {config!r} is not a ModelConfig dataclass")
        elif cls.image_input not in ("regions", "pixels"):
            problems.append(f"image_input={cls.image_input!r}; declare 'regions' or 'pixels'")
        else:
            fields = {f.name for f in dataclasses.fields(config)}
            if cls.image_input == "pixels":
                problems += [f"a pixel family's config needs an {f!r} field" for f in ("image_size", "patch_size")
                             if f not in fields]
            try:
                mapped = cls.data_fields({})
            except (TypeError, ValueError) as err:
                mapped, problems = {}, problems + [str(err)]
            takes_keep_rows = "keep_rows" in inspect.signature(cls.fuse).parameters
            if cls.keeps_rows != takes_keep_rows:
                problems.append(f"keeps_rows={cls.keeps_rows} but {cls.__name__}.fuse "
                                f"{'takes' if takes_keep_rows else 'does not take'} keep_rows: declare keeps_rows = "
                                f"{takes_keep_rows}")
            taken = DATA_SIZES if cls.image_input == "regions" else ("vocab_size",)
            lacking = {size: field for size, field in mapped.items() if size in taken and field not in fields}
            if lacking:
                default = "declares no size_fields, so vlkit's defaults apply" if "size_fields" not in vars(cls) \
                    else "maps them in size_fields"
                problems.append(f"{config.__name__} has no field {', '.join(repr(f) for f in lacking.values())} for the "
                                f"data's {', '.join(lacking)} ({cls.__name__} {default}): declare size_fields = "
                                "{data size: your config's field, or None for a size the family does not take}")
        if problems:
            raise RegistrationError(f"model {name or cls.family!r} ({describe_entry(cls)}) breaks the family contract "
                                    f"(VLModel.check_contract): " + "; ".join(problems))

    def data_field(self, size: str) -> str | None:
        """The config field that holds the data size ``size`` (`DATA_SIZES`), None when the family takes none."""
        return type(self).data_fields(self.config.to_dict()).get(size)

    def data_size(self, size: str) -> int | None:
        """The config value of the data size ``size`` (`DATA_SIZES`), None when the family takes no such size."""
        name = self.data_field(size)
        return None if name is None else getattr(self.config, name)

    @property
    def region_feature_size(self) -> int | None:
        """The region feature dimension the model takes (region families; None when it takes none)."""
        return self.data_size("region_feature_size") if self.image_input == "regions" else None

    @property
    def region_classes(self) -> int | None:
        """The detector classes (with background) of the region soft labels the model reads (MRC), or None."""
        return self.data_size("region_classes") if self.image_input == "regions" else None

    @property
    def image_size(self) -> int | None:
        """Input image side in pixels (pixel families; None for region families)."""
        return self._pixel_field("image_size")

    @property
    def patch_size(self) -> int | None:
        """Pixels per image-token side (pixel families; None for region families)."""
        return self._pixel_field("patch_size")

    def _pixel_field(self, name: str) -> int | None:
        if self.image_input != "pixels":
            return None
        if not hasattr(self.config, name):
            raise TypeError(f"{self.family} takes pixels: its config must have an {name!r} field")
        return getattr(self.config, name)

    def extend_image_types(self, count: int) -> None:
        """Grow the image token types to ``count`` (the new ones copy type 1) and record it in the config."""
        raise TypeError(f"{self.family} has no image token types")

    @classmethod
    def official_tokenizer(cls, config: ModelConfig) -> str:
        """The tokenizer the family's official code pairs with ``config`` (its recipe's, `recipe_of`)."""
        return recipe_of(cls).official_tokenizer(config)

    def task_inputs(self, task: str, batch: VLBatch, task_id: int | None = None) -> dict[str, Any]:
        """Extra forward keywords for downstream ``task`` (none by default)."""
        return {}

    def get_input_embeddings(self) -> nn.Embedding:
        """The word embeddings (the MLM decoder ties to them; ``vocab_size`` reads them). The default reads a BERT
        text stream's ``embeddings.word_embeddings``; a family laid out otherwise overrides it."""
        word = getattr(getattr(self, "embeddings", None), "word_embeddings", None)
        if not isinstance(word, nn.Embedding):
            raise TypeError(f"{type(self).__name__} ({self.family}) has no embeddings.word_embeddings: override "
                            "get_input_embeddings() to return its word embedding table")
        return word

    def get_region_projection(self) -> nn.Linear:
        """The linear layer that projects region features into the model (MRFR ties to it)."""
        raise TypeError(f"{self.family} takes no region features")

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    # -- example inputs ----------------------------------------------------------------------
    def example_batch(self, batch_size: int = 2, seed: int = 0, text_len: int = 12, num_regions: int = 10,
                      padded: bool = True, values: bool = True) -> VLBatch:
        """Valid random inputs of the kind this family takes, on the model's device; the last example is padded
        shorter (``padded``). ``values=False``: the floating-point inputs are shapes only, on the meta device, and
        ids and masks stay on the CPU (a FLOP count, `vlkit.flops.count`)."""
        g = torch.Generator().manual_seed(seed)

        def floats(*shape: int, normal: bool = False) -> torch.Tensor:
            if not values:
                return torch.empty(shape, device="meta")
            return torch.randn(*shape, generator=g) if normal else torch.rand(*shape, generator=g)

        pad_id = getattr(self.config, "pad_token_id", 0)
        ids = torch.randint(pad_id + 1, self.vocab_size, (batch_size, text_len), generator=g)
        mask = torch.ones(batch_size, text_len, dtype=torch.long)
        if batch_size > 1 and padded:
            mask[-1, text_len // 2:] = 0
            ids[-1, text_len // 2:] = pad_id
        fields: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
        if self.image_input == "regions":
            k, d, c = num_regions, self.region_feature_size, self.region_classes
            xy = floats(batch_size, k, 2) * 0.5
            wh = floats(batch_size, k, 2) * 0.5 + 0.05
            region_mask = torch.ones(batch_size, k, dtype=torch.long)
            if batch_size > 1 and padded:
                region_mask[-1, k // 2:] = 0
            fields.update(
                region_feats=floats(batch_size, k, d) * region_mask[..., None].to(xy.device),
                region_boxes=torch.cat([xy, xy + wh], dim=-1),
                region_mask=region_mask,
            )
            if c is not None:  # soft labels of the detector's classes (a family that reads none gets none)
                fields["region_soft_labels"] = torch.softmax(floats(batch_size, k, c, normal=True), dim=-1)
        else:
            size = self.image_size
            fields["pixel_values"] = floats(batch_size, 3, size, size, normal=True)
        batch = VLBatch(**fields)
        return batch.to(self.device) if values else batch

    # -- save / load -----------------------------------------------------------------------------
    def config_to_save(self) -> dict[str, Any]:
        """The config that rebuilds this model without any external file."""
        return self.config.to_dict()

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write ``config.json`` and ``model.safetensors`` (each atomically) into ``directory``, and the model's
        processor (``processor.json`` and ``tokenizer/``) when it has one (`vlkit.build_model(processor=)`)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        save_weights(self, directory / WEIGHTS_NAME, metadata={"family": self.family, "format": "pt"})
        meta = {"family": self.family, "vlkit_version": __version__, "config": self.config_to_save()}
        atomic_write_text(directory / CONFIG_NAME, json.dumps(meta, indent=2, sort_keys=True))
        if getattr(self, "processor", None) is not None:
            self.processor.save_pretrained(directory)
        return directory


def split_model_config(cfg: Mapping) -> tuple[str, str | None, dict[str, Any]]:
    """``{name, preset, <field>: value | null}`` -> (name, preset, the non-null field overrides)."""
    cfg = dict(unwrap(cfg))
    if "name" not in cfg:
        raise KeyError(f"a model config needs a 'name' key (one of {', '.join(MODELS.names())}); got keys {sorted(cfg)}")
    name, preset = cfg.pop("name"), cfg.pop("preset", None)
    return name, preset, {k: v for k, v in cfg.items() if v is not None}


def build_model(name_or_cfg: Any, preset: str | None = None, pretrained: str | None = None, **overrides: Any) -> VLModel:
    """``build_model("uniter", preset="tiny", num_hidden_layers=4)``, ``build_model(cfg_mapping)``
    (a ``{name, preset, <field>: value}`` mapping such as the ``model`` node of a command config; the
    arguments override its values) or ``build_model(config_dataclass)`` (a resolved config: ``preset=``
    must be its own, field arguments replace its values). ``build_model("uniter", pretrained="base.official")``
    loads the family's named released weights (`vlkit.released.PRETRAINED`, ``vlkit.list_pretrained()``) from
    their converted run on disk; nothing is downloaded."""
    if pretrained is not None:
        return load_pretrained(name_or_cfg, pretrained, preset, overrides)
    if isinstance(name_or_cfg, ModelConfig):
        if preset is not None and preset != name_or_cfg.preset:
            raise ValueError(f"build_model: the {name_or_cfg.family} config is preset {name_or_cfg.preset!r}, not "
                             f"preset={preset!r}; build from the family name to choose a preset")
        if overrides:
            name_or_cfg = dataclasses.replace(name_or_cfg, **overrides)
        return MODELS.get(name_or_cfg.family)(name_or_cfg)
    if isinstance(name_or_cfg, Mapping) or hasattr(name_or_cfg, "keys"):
        name, cfg_preset, cfg_overrides = split_model_config(name_or_cfg)
        return build_model(name, preset or cfg_preset, **{**cfg_overrides, **overrides})
    name, named_preset = model_name(name_or_cfg)
    if preset is not None and named_preset is not None and preset != named_preset:
        raise ValueError(f"build_model: {name_or_cfg!r} names preset {named_preset!r}, not preset={preset!r}")
    cls = MODELS.get(name)
    return cls(cls.config_class.from_preset(preset or named_preset, **overrides))


def model_name(name: str) -> tuple[str, str | None]:
    """(family, preset or None) of a model name: a family (``uniter``), or a preset as `list_presets` names it
    (``uniter/tiny``) or as ``model=`` does (``uniter_tiny``). A known family with an unknown preset is refused
    naming the family's presets (`UnknownNameError`); an unknown family is left for the registry to refuse, or, when
    the name has a preset part, refused with the closest ``family/preset`` names."""
    families = MODELS.names()
    if name in families:
        return name, None
    named = {}
    for family in families:
        for preset in MODELS.get(family).config_class.presets:
            if name in (f"{family}/{preset}", f"{family}_{preset}"):
                return family, preset
            named[f"{family}/{preset}"] = family
    for family in sorted(families, key=len, reverse=True):  # the longest family a name starts with
        for sep in "/_":
            if name.startswith(family + sep):
                preset = name[len(family) + 1:]
                presets = list(MODELS.get(family).config_class.presets)
                close = difflib.get_close_matches(preset, presets, n=1, cutoff=0.6)
                hint = f" (did you mean '{family}/{close[0]}'?)" if close else ""
                raise UnknownNameError(f"unknown model {name!r}: the family {family!r} is right but it has no preset "
                                       f"{preset!r}{hint}; its presets: "
                                       f"{', '.join(f'{family}/{p}' for p in presets)}")
    if "/" in name:
        raise UnknownNameError(f"unknown model {name!r}{did_you_mean(name, named)}; families: {', '.join(families)}, "
                               f"presets: {', '.join(named)}")
    return name, None


def load_pretrained(family: Any, tag: str, preset: str | None = None, overrides: Mapping[str, Any] | None = None
                    ) -> VLModel:
    """The model of the named weights ``<family>/<tag>``, from the run `vlkit convert` wrote for them."""
    if not isinstance(family, str):
        raise TypeError(f"build_model(pretrained={tag!r}) takes a family name, not {type(family).__name__}")
    entry = pretrained_weights(family, tag)
    if preset is not None and preset != tag.split(".")[0]:
        raise ValueError(f"build_model: pretrained={tag!r} is preset {tag.split('.')[0]!r}, not preset={preset!r}")
    if overrides:
        raise ValueError(f"build_model: pretrained={tag!r} fixes the config; {', '.join(sorted(overrides))} cannot be "
                         "overridden (build the model, then change it)")
    if not entry.converted:
        released = known_file(entry.file)
        where = f" (released at {released.source})" if released else ""
        raise FileNotFoundError(f"{entry.name}: not converted yet: no run in {entry.directory}; convert the released "
                                f"{entry.file}{where} once with: {entry.convert_command()}")
    return from_pretrained(entry.directory / "model")


def list_presets() -> list[str]:
    """Every preset of every registered family as ``<family>/<preset>``."""
    return [f"{name}/{preset}" for name in MODELS.names() for preset in MODELS.get(name).config_class.presets]


def from_pretrained(directory: str | Path, map_location: str | torch.device = "cpu") -> VLModel:
    """Rebuild a model saved by ``save_pretrained`` (same family, preset, config and weights); a run
    directory (a pre-training or fine-tuning output, a converted official checkpoint) gives its ``model/``.
    Every failure names the file at fault."""
    directory = Path(directory)
    if not (directory / CONFIG_NAME).is_file() and (directory / "model" / CONFIG_NAME).is_file():
        directory = directory / "model"
    config_path, weights_path = directory / CONFIG_NAME, directory / WEIGHTS_NAME
    for path in (config_path, weights_path):
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: not a vlkit model directory (save_pretrained writes "
                                    f"{CONFIG_NAME} and {WEIGHTS_NAME})")
    try:
        meta = json.loads(config_path.read_text(encoding="utf-8"))
        family, values = meta["family"], meta["config"]
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as err:
        raise ValueError(f"{config_path}: not a vlkit model config ({type(err).__name__}: {err})") from err
    try:
        cls = MODELS.get(family)
    except UnknownNameError as err:
        raise UnknownNameError(f"{config_path}: {err} (is the plugin that provides it installed?)") from err
    names = {f.name for f in dataclasses.fields(cls.config_class)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"{config_path}: unknown {family} config key(s) {', '.join(unknown)}")
    model = cls(cls.config_class(**values))
    missing, unexpected = load_weights(model, weights_path, map_location, strict=False)
    if missing or unexpected:
        raise WeightsMismatchError(f"{weights_path}: weights do not match the {family} config of {config_path} "
                                   f"({key_difference(missing, unexpected)})")
    return model
