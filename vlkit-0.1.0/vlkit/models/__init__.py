"""The model families and their shared layers. Families register themselves in `vlkit.MODELS`."""
