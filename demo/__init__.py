"""The demo: ``gate demo``, the whole story on one machine (``demo._run``), and the local
broker and Redis processes it starts (``demo._local``, which the tests and benchmarks use too).

The top of the project: it runs a gate and consumers on the SDK together, so it imports both,
and neither imports it. ``gate demo`` reaches the command line through the entry point group
``gate.commands`` (``demo._command``; see pyproject.toml). Nothing is imported here: the
command line loads ``demo._command`` whenever it starts.
"""
