"""Engine files: their sidecars (``artifact``) and the one place runners are made (``registry``: engine
files and the models calibkit makes). The runners themselves are in ``calibkit.engines``."""
