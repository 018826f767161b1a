"""Requests: what each command is asked, one frozen value per command, every option declared once.

A request is checked once, when it is made (``__post_init__`` calls its ``validate()``, which reads no file):
a request value that exists is a valid one, so the command line, the API and the pipelines take it as it is.

``options`` declares a field's option (default, help, spelling, numeric bound); ``checks`` holds the checks every
``validate()`` and API function make; ``choices`` the word sets several requests share; ``traffic`` reads where
traffic evidence comes from; ``resources`` declares the options of what a run may use (they are no field of a
request). ``sample.SampleRequest``, ``calibrate.CalibrateRequest``, ``build.BuildRequest``,
``compare.CompareRequest`` and ``tune.TuneRequest`` are the requests of ``calibkit sample``, ``calibrate``,
``build``, ``compare`` and ``tune``; each sits in the layer of the pipeline that reads it (docs/architecture.md).
"""
