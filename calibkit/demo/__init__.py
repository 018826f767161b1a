"""The demo: a real sentiment model (all-MiniLM-L6-v2), real labelled text and a realistic production log.

``calibkit.demo.prepare.prepare_demo`` builds them; ``archive`` reads the data, ``model`` (the only module that
imports torch) fine-tunes and exports, ``head`` fits the fast variant's logistic-regression head, ``traffic``
generates the log.
"""
