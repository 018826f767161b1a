"""Calibration: activation statistics (collect, stats, histogram), methods, the TensorRT cache, calibration.json.

Modules: ``histogram`` (mergeable power-of-two |x| histograms), ``stats`` (ActivationStats, StatsStore),
``collect`` (run the tapped model over length-bucketed batches, padding masked), ``statscache`` (reuse across
runs), ``methods`` (minmax / percentile / entropy / mse: pure functions of the statistics), ``trtcache`` (TensorRT
legacy cache reader/writer), ``tablefile`` (calibration.json), ``pipeline`` (``calibrate`` end to end).
"""
