"""vlkit's version, written once: ``vlkit.__version__``, the wheel's version (``pyproject.toml`` reads it) and
what saved models, run records, feature stores and comparison manifests record."""
__version__ = "0.1.0"
