"""What the gate says about a gate's state, pure: the verdict in words and ``/status``'s
summaries and details (``_report``), their documented shape, the API's schema
(``_status_bodies``), and a detail's partitions written as JSON text directly
(``_detail_json``).

Used by the HTTP API, the service's log lines and the demo; it does no I/O (a contract in
pyproject.toml). Nothing is imported here.
"""
