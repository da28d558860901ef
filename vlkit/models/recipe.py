"""A family's recipe: what its official code does with the architecture, kept beside the model file and out of
the model class. `register_recipe("uniter", Recipe(...))` files it in `RECIPES` (keyed by family) and its
released files and named weights in `vlkit.released`; the commands, objectives, trainer presets, the RefExp
task and the converters read it with `recipe_of`.

A recipe is checked when it registers (`Recipe.check_contract`): its trainer preset's keys against the trainer's
settings, as ``conf/trainer/default.yaml`` lists them (the mirror of `vlkit.train.TrainerConfig` the command line
composes; the trainer's room is above this one), so that a misspelt key is refused naming the family, not met by
every command later. The values, and the objective defaults against the objectives' options, are checked by the
family contract (`vlkit.testing.FamilyContract`), which may build what they belong to."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from vlkit.io import config_dir, read_yaml
from vlkit.registry import MODELS, Registry, RegistrationError, did_you_mean
from vlkit.released import PretrainedWeights, ReleasedFile, register_pretrained, register_released_file

RECIPES = Registry("recipe", home="vlkit.models")

# the recipe a family gets from the attributes an older plugin declares on its model class (no registered recipe)
_CLASS_FIELDS = {"mix": "default_mix", "tokenizer": "default_tokenizer", "objective_defaults": "objective_defaults",
                 "trainer_preset": "trainer_preset"}


@dataclass(frozen=True)
class Recipe:
    """A family's recipes, as its official code sets them.

    - ``mix``: its pre-training objective mix (a preset name of ``conf/objectives``, a YAML path or a mapping;
      what ``objectives=`` defaults to);
    - ``tokenizer``: its official tokenizer (what ``data.tokenizer: null`` resolves to), or a function of the model
      config that names it (METER: RoBERTa or BERT by its text tower);
    - ``objective_defaults``: objective name -> option defaults;
    - ``trainer_preset``: `TrainerConfig` fields of its official optimisation (``trainer=<family>``);
    - ``refexp``: the hit rule of its official RefExp evaluation, ``(box convention, comparison)``
      (`vlkit.tasks.metrics.IOU_BOXES`, ``>=`` | ``>``); None: no official evaluation (``continuous``, ``>=``);
    - ``released``: the files its publisher releases (`vlkit.released.ReleasedFile`), ``pretrained``: its named
      weights (`vlkit.released.PretrainedWeights`, ``build_model(family, pretrained=tag)``).
    """

    mix: Any = None
    tokenizer: str | Callable[[Any], str] = "bert-base-uncased"
    objective_defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    trainer_preset: Mapping[str, Any] = field(default_factory=dict)
    refexp: tuple[str, str] | None = None
    released: tuple[ReleasedFile, ...] = ()
    pretrained: tuple[PretrainedWeights, ...] = ()

    def official_tokenizer(self, config: Any) -> str:
        """The tokenizer the family's official code pairs with ``config``."""
        return self.tokenizer(config) if callable(self.tokenizer) else self.tokenizer

    def check_contract(self, family: str) -> None:
        """Refuse (`RegistrationError`, naming the family and each problem) a recipe whose released files or named
        weights belong to another family, whose trainer preset sets a key that is no trainer setting
        (`trainer_settings`), or whose RefExp rule is not a (box convention, comparison) pair."""
        problems = [f"released file {f.name!r} is declared for family {f.family!r}" for f in self.released
                    if f.family != family]
        problems += [f"pretrained weights {w.name!r} belong to family {w.family!r}" for w in self.pretrained
                     if w.family != family]
        problems += [f"pretrained weights {w.name!r} name the file {w.file!r}, which the recipe does not release"
                     for w in self.pretrained if self.released and w.file not in {f.name for f in self.released}]
        unknown = sorted(set(self.trainer_preset) - trainer_settings())
        problems += [f"trainer_preset key {key!r} is not a trainer setting{did_you_mean(key, trainer_settings())}"
                     for key in unknown]
        if self.refexp is not None and not (isinstance(self.refexp, tuple) and len(self.refexp) == 2
                                            and all(isinstance(x, str) for x in self.refexp)):
            problems.append(f"refexp={self.refexp!r}; give (box convention, comparison), e.g. ('continuous', '>=')")
        if problems:
            raise RegistrationError(f"recipe of {family!r} (vlkit.models.recipe.Recipe.check_contract): "
                                    + "; ".join(problems))


@functools.cache
def trainer_settings() -> frozenset[str]:
    """The keys a trainer preset may set: those of ``conf/trainer/default.yaml``, which mirrors
    `vlkit.train.TrainerConfig` (tests/models/test_recipe.py holds the two equal)."""
    return frozenset(read_yaml(config_dir() / "trainer" / "default.yaml", "trainer defaults"))


def register_recipe(family: str, recipe: Recipe, override: bool = False) -> Recipe:
    """File ``recipe`` as the recipe of ``family`` in `RECIPES`, and its released files and named weights in
    `vlkit.released` (the registries ``vlkit convert`` and ``build_model(pretrained=)`` read)."""
    if not isinstance(recipe, Recipe):
        raise RegistrationError(f"register_recipe({family!r}): give a vlkit Recipe, not {type(recipe).__name__}")
    RECIPES.register(family, override=override)(recipe)
    for entry in recipe.released:
        register_released_file(entry, override=override)
    for weights in recipe.pretrained:
        register_pretrained(weights, override=override)
    return recipe


def recipe_of(model: Any) -> Recipe:
    """The recipe of a family: a family name, a model class or a model. A family that registers none gets the one
    its model class declares in the attributes older plugins set (``default_mix``, ``default_tokenizer``,
    ``objective_defaults``, ``trainer_preset``), else an empty `Recipe`."""
    cls = None
    if isinstance(model, str):
        family = model
    else:
        cls = model if isinstance(model, type) else type(model)
        family = cls.family
    if family in RECIPES:
        return RECIPES.get(family)
    if cls is None:
        cls = MODELS.get(family)
    declared = {key: getattr(cls, attr) for key, attr in _CLASS_FIELDS.items() if hasattr(cls, attr)}
    return Recipe(**declared)
