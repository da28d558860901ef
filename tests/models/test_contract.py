"""Issue 45: every registered family (`vlkit.list_models`) passes the family contract suite, `vlkit.testing`:
one generated class per family, ``TestUniterContract::test_save_and_load_round_trip`` ..."""
import vlkit
from vlkit.testing import FamilyContract

for _family in vlkit.list_models():
    _name = "Test" + "".join(part.title() for part in _family.replace("-", "_").split("_")) + "Contract"
    globals()[_name] = type(_name, (FamilyContract,), {"family": _family, "__module__": __name__})
