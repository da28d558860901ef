"""A plugin that registers an objective, then fails on import (a dependency it lacks): vlkit must leave it out
whole, the objective it registered first included."""
import vlkit


@vlkit.register_objective("half_registered")
class HalfRegistered(vlkit.Objective):
    name = "half_registered"


import vlkit_faulty_missing_dependency  # noqa: E402,F401 - not installed: the import fails
