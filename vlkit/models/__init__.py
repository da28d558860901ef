"""The model families and their shared layers. Families register themselves in `vlkit.MODELS` (their heads in
`vlkit.HEADS`, the image encoders in `vlkit.ENCODERS`): this package is the home of those registries, so a new
built-in family is one more name here."""
from vlkit.models import encoders, heads  # noqa: F401  (register the generic heads and the image encoders)
from vlkit.models import vilbert, uniter, meter  # noqa: F401  (register the families and their heads, in this order)
