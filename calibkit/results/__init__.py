"""The results calibkit returns and the documents it ships: typed, frozen, plain data (no NaN).

``runs``: what compare and tune return (``Comparison``, ``TuneResult``, ...); ``documents``: plan.json and
deploy.json; ``flags``: the layer flags and the thresholds they are raised by; ``intervals``: the paired
intervals and exact McNemar test every difference is judged by. The layer below ``report``: it imports
only the foundation.
"""
