"""Package discovery (the rest of the metadata is in pyproject.toml): every folder under ``vlkit/`` is a
package, data folders such as ``features/assets`` included, and so is every folder under ``conf/``, which
ships as ``vlkit.conf`` (pyproject.toml maps the directory)."""
from setuptools import find_namespace_packages, setup

found = find_namespace_packages(include=["vlkit", "vlkit.*"], exclude=["*.__pycache__"])
conf = find_namespace_packages("conf", exclude=["*.__pycache__"])
setup(packages=[*found, "vlkit.conf", *(f"vlkit.conf.{name}" for name in conf)])
