"""Package discovery (the rest of the metadata is in pyproject.toml): every ``vlkit.*`` package found on disk,
plus ``vlkit.conf``, which pyproject.toml maps to the repository's ``conf/``."""
from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["vlkit", "vlkit.*"]), "vlkit.conf"])
