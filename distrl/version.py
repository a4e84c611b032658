"""distrl's version (also pyproject.toml's); checkpoints record it."""

__version__ = "0.1.0"
