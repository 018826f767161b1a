"""Requests: what each command is asked, one frozen value per command, every option declared once.

``options`` declares a field's option (default, help, spelling, numeric bound); ``checks`` holds the checks every
``validate()`` and API function make; ``traffic`` reads where traffic evidence comes from; ``resources`` declares
the options of what a run may use (they are no field of a request). ``compare.CompareRequest`` and
``tune.TuneRequest`` are the requests of ``calibkit compare`` and ``calibkit tune``.
"""
