"""A family (UNITER's architecture under another name) whose recipe misspells a trainer key (``warmup_stpes``):
the plugin is refused at registration, naming it and its recipe, and vlkit's own families work."""
from dataclasses import dataclass

import vlkit
from vlkit.models.recipe import Recipe, register_recipe
from vlkit.models.uniter import Uniter, UniterConfig


@dataclass
class TypoConfig(UniterConfig):
    family = "typo_uniter"


@vlkit.register_model("typo_uniter")
class TypoUniter(Uniter):
    family = "typo_uniter"
    config_class = TypoConfig


register_recipe("typo_uniter", Recipe(mix="uniter", trainer_preset={"lr": 5e-5, "warmup_stpes": 0.1}))
