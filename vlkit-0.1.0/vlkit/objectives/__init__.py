"""Pre-training objectives (one registered class each, with its own head), masking and the mixture."""
from vlkit.objectives import itc, itm, mim, mlm, mrm, wra  # noqa: F401  (register the objectives)
from vlkit.objectives.base import IncompatibleObjective, Objective, PassContext, TokenInfo
from vlkit.objectives.mix import Pretraining, build_objective, build_pretraining, load_mix

__all__ = ["IncompatibleObjective", "Objective", "PassContext", "Pretraining", "TokenInfo", "build_objective",
           "build_pretraining", "load_mix"]
