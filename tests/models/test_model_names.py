"""Model names: a right family with a wrong preset is refused as such, suggesting the close ``family/preset``."""
import pytest

import vlkit
from vlkit.registry import UnknownNameError


@pytest.mark.parametrize("name", ["uniter/tinny", "uniter_tinny"])
def test_a_misspelt_preset_of_a_right_family_suggests_the_preset(name):
    with pytest.raises(UnknownNameError) as err:
        vlkit.build_model(name)
    message = str(err.value)
    assert "the family 'uniter' is right but it has no preset 'tinny'" in message
    assert "(did you mean 'uniter/tiny'?)" in message and "uniter/base" in message.split(";")[1]


def test_a_misspelt_family_with_a_preset_suggests_full_names():
    with pytest.raises(UnknownNameError, match=r"'unitr/tiny' \(did you mean 'uniter/tiny'"):
        vlkit.build_model("unitr/tiny")
    assert vlkit.build_model("uniter/tiny").config.preset == "tiny"
