"""Inference backends behind one Runner protocol. Backends are leaves: only ``registry`` imports them."""
