"""kernelcache's version: the wheel's (pyproject.toml's hatch version path reads it here), the one ``--version``
prints, and the one a bundle's build record and the cache dir's check records carry."""

__version__ = "0.1.0"
