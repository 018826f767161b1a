"""calibkit: INT8 calibration and quantization-accuracy workbench for transformer models."""

__version__ = "0.2.0"

__all__ = ["__version__"]
