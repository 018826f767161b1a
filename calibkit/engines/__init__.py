"""Runners: inference backends behind one Runner protocol. Backends are leaves: only
``calibkit.enginefiles.registry`` (the one place runners are made), ``calibkit.building`` and ``calibkit.deploy``
import them; engine files and their sidecars are ``calibkit.enginefiles``."""
