"""The keys of an objective mix: a misspelt objective of the short form is named alone, with the closest
objective; a unit key its sampling mode would ignore is refused, naming the objective, the key and the mode."""
import pytest

from vlkit.objectives.mix import load_mix


def test_the_short_form_blames_only_the_unknown_objective_and_suggests_the_close_one():
    with pytest.raises(KeyError) as err:
        load_mix({"mlm": 1, "itmm": 1})
    message = str(err.value)
    assert "unknown objective(s) 'itmm' (did you mean 'itm'?)" in message
    assert "'mlm'" not in message.split(";")[0]  # the valid objective is not blamed


@pytest.mark.parametrize("mix, key, mode", [
    ({"sampling": "sum", "objectives": {"mlm": {"ratio": 2}, "itm": {"weight": 1}}}, "objectives.mlm.ratio", "summed"),
    ({"sampling": "per_batch", "objectives": {"mlm": {"weight": 2}, "itm": {"ratio": 1}}}, "objectives.mlm.weight",
     "per-batch"),
    ({"objectives": {"mlm": {"ratio": 1}, "itc": {"ratio": 3, "every_step": True}}}, "objectives.itc.ratio",
     "every_step"),
])
def test_a_unit_key_its_sampling_ignores_is_refused(mix, key, mode):
    with pytest.raises(ValueError, match=rf"{key}.*{mode}"):
        load_mix(mix)


def test_the_keys_each_mode_reads_are_accepted():
    assert load_mix({"sampling": "sum", "objectives": {"mlm": {"weight": 2}}})["objectives"]["mlm"] == {"weight": 2}
    every = {"mlm": {"ratio": 1}, "itc": {"weight": 0.5, "every_step": True}, "itm": {"ratio": 1, "wra": {"weight": 0.1}}}
    assert load_mix({"objectives": every})["objectives"] == every
