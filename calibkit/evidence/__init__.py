"""The statistics of evidence: which texts a decision rests on, how a candidate is judged on them, and what the
holdout confirms.

Plain values and callables in, decisions and typed results out: no module here runs a model, reads a file or
imports ``calibkit.evaluate``. compare and tune (``calibkit.evaluate``) measure and orchestrate; this package
draws the subsets, computes the intervals, runs the decision rules and says what the evidence supports.
"""
