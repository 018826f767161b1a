"""The results calibkit returns and the documents it ships: typed, frozen, plain data (no NaN).

``runs``: what compare and tune return (``Comparison``, ``TuneResult``, ...); ``documents``: plan.json and
deploy.json; ``flags``: the layer flags and the thresholds they are raised by; ``files``: the other documents a run
writes; ``codec``: their JSON. The layer below ``report`` and ``evidence`` (whose intervals and decisions it
holds as plain values): it imports only the foundation.
"""
