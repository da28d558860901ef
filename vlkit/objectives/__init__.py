"""Pre-training objectives (one registered class each, with its own head), the corruption views they score,
masking and the mixture."""
from vlkit.objectives import corruption, itc, itm, mim, mlm, mrm, wra  # noqa: F401  (register the views, objectives)
from vlkit.objectives.base import IncompatibleObjective, Objective, PassContext, TokenInfo
from vlkit.objectives.corruption import Corruption
from vlkit.objectives.mix import Pretraining, build_objective, build_pretraining, load_mix

__all__ = ["Corruption", "IncompatibleObjective", "Objective", "PassContext", "Pretraining", "TokenInfo",
           "build_objective", "build_pretraining", "load_mix"]
