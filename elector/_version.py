"""The release: the one source of the package's version.

pyproject.toml reads it (setuptools' dynamic version), `elector.__version__` re-exports it, and
every chart's appVersion, the Dockerfile's VERSION and the docs repeat it (tests/cli/test_version.py
keeps them equal). Its own module, importing nothing, so that any layer may read it.
"""

__version__ = "0.2.0"
