"""The HTTP API over a running service (FastAPI): the app, its token and errors (``_api``), the
release API (``_release_api``), the operator's API and the status page (``_status_api``, the
page's assets in ``static/``), their bodies (``_bodies``), large answers kept per gate state
(``_answers``), waits that end when the service stops (``_waits``), request limits
(``_limits``), and running it all with uvicorn (``_serve``).

The top of the gate below the command line. Nothing is imported here: the rest of the gate
runs without FastAPI.
"""
