"""Issue 45: every registered family (`vlkit.list_models`) passes the family contract suite, `vlkit.testing`:
one generated class per family, ``TestUniterContract::test_save_and_load_round_trip`` ..."""
import pytest

import vlkit
from vlkit.models.recipe import RECIPES, Recipe
from vlkit.testing import FamilyContract

for _family in vlkit.list_models():
    _name = "Test" + "".join(part.title() for part in _family.replace("-", "_").split("_")) + "Contract"
    globals()[_name] = type(_name, (FamilyContract,), {"family": _family, "__module__": __name__})


@pytest.mark.parametrize("recipe, problem", [
    (Recipe(mix="uniter", trainer_preset={"lr": -1.0}), "uniter: its recipe's trainer_preset: trainer.lr must be >= 0"),
    (Recipe(mix="uniter", objective_defaults={"itm": {"negativs": "image"}}),
     "uniter: its recipe's objective_defaults['itm']: objective 'itm' has no option(s) negativs"),
    (Recipe(mix="uniter", objective_defaults={"itmm": {}}), "uniter: its recipe's objective_defaults['itmm']: "),
])
def test_the_contract_checks_the_recipe_by_its_owners_naming_the_family(monkeypatch, recipe, problem):
    """Issue 52: a recipe's trainer preset is checked as a `TrainerConfig` (its values too: registering checks the
    keys) and its objective defaults by the objectives they set, each error naming the family."""
    monkeypatch.setitem(RECIPES._entries, "uniter", recipe)
    with pytest.raises(AssertionError) as err:
        TestUniterContract().test_recipe_keys_belong_to_their_owners()  # noqa: F821 - generated above
    assert problem in str(err.value)


def test_the_flop_count_of_a_step_is_checked_against_the_computed_one(monkeypatch):
    """A family whose step the meta device counts otherwise than the computed step fails, naming it."""
    from vlkit import testing

    real = testing.pretrain_step_flops

    def skewed(pretraining, shapes, values=False):
        counted = real(pretraining, shapes, values)
        return counted if values else {**counted, "per_objective": {k: v * 1.05 for k, v in counted["per_objective"].items()}}

    monkeypatch.setattr(testing, "pretrain_step_flops", skewed)
    with pytest.raises(AssertionError, match="meter: a step of mlm\\+itm counts .* FLOPs on the meta device"):
        TestMeterContract().test_a_training_step_is_counted_on_the_meta_device()  # noqa: F821 - generated above
