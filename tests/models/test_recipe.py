"""Issue 45 item 2: a family's recipe (mix, objective defaults, trainer preset, tokenizer, RefExp rule, released
files and weights) is registered beside its model file and read by the callers; the model class keeps the
architecture, and its optional hooks are declared and checked when the family registers. Issue 52: a trainer
preset key that is no trainer setting is refused when the recipe registers, naming the family."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import vlkit
from vlkit.models.base import BertStreamConfig, VLModel
from vlkit.models.recipe import RECIPES, Recipe, recipe_of, register_recipe, trainer_settings
from vlkit.registry import MODELS, RegistrationError
from vlkit.released import PRETRAINED, RELEASED_FILES, PretrainedWeights, ReleasedFile
from vlkit.train import TrainerConfig

FAMILIES = ("vilbert", "uniter", "meter")


def test_each_builtin_family_registers_its_recipe_and_its_model_class_carries_none():
    for family in FAMILIES:
        recipe = RECIPES.get(family)
        assert recipe_of(family) is recipe is recipe_of(MODELS.get(family))
        assert recipe.mix == family and recipe.trainer_preset and recipe.objective_defaults["itm"]
        for attr in ("default_mix", "default_tokenizer", "objective_defaults", "trainer_preset"):
            assert not hasattr(MODELS.get(family), attr), f"{family}: {attr} is on the model class"


def test_the_released_registries_are_filled_from_the_recipes():
    for family in FAMILIES:
        recipe = RECIPES.get(family)
        assert recipe.released and recipe.pretrained
        assert {f.name for f in recipe.released} <= set(RELEASED_FILES.names())
        assert {w.name for w in recipe.pretrained} == {n for n in PRETRAINED.names() if n.startswith(f"{family}/")}
    owners = {RELEASED_FILES.get(n).family for n in RELEASED_FILES.names()}
    assert owners == {"vilbert", "uniter", "meter", "detector"}  # the detector's stay in vlkit.released
    assert len(RELEASED_FILES.names()) == 18 and len(PRETRAINED.names()) >= 7


def test_the_tokenizer_may_depend_on_the_config():
    meter = MODELS.get("meter")
    for encoder, tokenizer in (("roberta", "roberta-base"), ("bert", "bert-base-uncased")):
        config = meter.config_class.from_preset("tiny", text_encoder=encoder)
        assert meter.official_tokenizer(config) == recipe_of(meter).official_tokenizer(config) == tokenizer
    assert MODELS.get("uniter").official_tokenizer(None) == "bert-base-cased"


def test_the_refexp_task_scores_with_the_recipe_rule(build_tiny):
    for family, rule in (("vilbert", ("plus_one", ">")), ("uniter", ("uniter", ">"))):
        task = vlkit.build_task("refexp", build_tiny(family))
        assert (task.iou_boxes, task.iou_comparison) == rule == recipe_of(family).refexp


def test_a_class_that_declares_its_recipe_the_older_way_still_gets_it():
    class Older(VLModel):
        family = "older"
        config_class = BertStreamConfig
        default_mix = "uniter"
        default_tokenizer = "bert-base-cased"
        trainer_preset = {"lr": 1e-3}

    recipe = recipe_of(Older)
    assert (recipe.mix, recipe.tokenizer, dict(recipe.trainer_preset), recipe.refexp) == (
        "uniter", "bert-base-cased", {"lr": 1e-3}, None)
    assert Older.official_tokenizer(None) == "bert-base-cased"


@pytest.mark.parametrize("recipe, problem", [
    (Recipe(released=(ReleasedFile("x.bin", "uniter", "w", "u", "o"),)), "released file 'x.bin' is declared for "
                                                                         "family 'uniter'"),
    (Recipe(pretrained=(PretrainedWeights("uniter", "base.x", "x.bin", "w"),)), "belong to family 'uniter'"),
    (Recipe(released=(ReleasedFile("y.bin", "newfam", "w", "u", "o"),),
            pretrained=(PretrainedWeights("newfam", "base.x", "x.bin", "w"),)), "which the recipe does not release"),
    (Recipe(refexp="plus_one"), "refexp='plus_one'"),
    (Recipe(trainer_preset={"lr": 1e-4, "warmpu": 0.1}), "trainer_preset key 'warmpu' is not a trainer setting (did "
                                                         "you mean 'warmup'?)"),
])
def test_a_recipe_is_checked_when_it_registers(recipe, problem):
    with pytest.raises(RegistrationError, match="recipe of 'newfam'") as err:
        register_recipe("newfam", recipe)
    assert problem in str(err.value)
    assert "newfam" not in RECIPES._entries and "y.bin" not in RELEASED_FILES._entries


def test_a_recipe_clash_is_refused_unless_on_purpose():
    with pytest.raises(RegistrationError, match="recipe 'uniter' is already registered"):
        register_recipe("uniter", Recipe(mix="vilbert"))
    assert RECIPES.get("uniter").mix == "uniter"


class _Fuses(VLModel):
    family = "fuses"
    config_class = BertStreamConfig

    def encode_text(self, batch, **kwargs):
        raise AssertionError

    encode_image = encode_text


@pytest.mark.parametrize("takes, declared, ok", [(True, True, True), (False, False, True), (True, False, False),
                                                 (False, True, False)])
def test_keeps_rows_is_declared_and_checked_against_fuse(takes, declared, ok):
    def fuse(self, text, image, pooled_only=False, keep_rows=None):
        raise AssertionError

    def plain_fuse(self, text, image, pooled_only=False):
        raise AssertionError

    cls = type("Family", (_Fuses,), {"fuse": fuse if takes else plain_fuse, "keeps_rows": declared})
    if ok:
        cls.check_contract("fuses")
    else:
        with pytest.raises(RegistrationError, match=f"keeps_rows={declared} but Family.fuse"):
            cls.check_contract("fuses")
    assert all(MODELS.get(f).keeps_rows for f in FAMILIES)


def test_the_word_embeddings_default_names_what_to_override():
    class NoEmbeddings(_Fuses):
        def fuse(self, text, image, pooled_only=False):
            raise AssertionError

    model = NoEmbeddings(BertStreamConfig())
    with pytest.raises(TypeError, match=r"NoEmbeddings \(fuses\) has no embeddings.word_embeddings: override "
                                        r"get_input_embeddings\(\)"):
        model.get_input_embeddings()
    model.embeddings = nn.Module()
    model.embeddings.word_embeddings = nn.Embedding(7, 2)
    assert model.vocab_size == 7 and isinstance(model.get_input_embeddings().weight, torch.Tensor)


def test_the_trainer_settings_a_recipe_may_set_are_the_trainer_configs():
    """`trainer_settings` reads ``conf/trainer/default.yaml`` (the trainer's room is above the recipes'): it lists
    every field of `TrainerConfig` and nothing else, and every built-in preset sets only those."""
    assert trainer_settings() == {f.name for f in dataclasses.fields(TrainerConfig)}
    for family in FAMILIES:
        assert set(RECIPES.get(family).trainer_preset) <= trainer_settings()
