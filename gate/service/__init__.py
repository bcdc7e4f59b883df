"""The gate service: its configuration (``_config``), the loop that polls, evaluates and
publishes, forever (``_service``), what it tells an operator tailing its log (``_events``) and
its Prometheus metrics (``_metrics``, with the gates' series in ``_series``).

Above polling, publishing and reports, below the HTTP API that serves it. Nothing is imported
here: the configuration is read without the service.
"""
