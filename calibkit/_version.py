"""The package version, the one place it is written (pyproject.toml reads it; ``calibkit.__version__`` re-exports
it). Modules inside calibkit import it from here, not from the package face, which re-exports the public API."""

__version__ = "0.2.0"
