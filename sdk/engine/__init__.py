"""The engine's pure core: which record may start next, what may be committed, what must pause.

No Kafka client, no threads, no clock of its own (the shell passes the time in): the shards,
their work items and the partitions they belong to (``_shards``), each assigned partition's
held records and commit point (``_partition``), the scheduler's transitions (``_scheduler``)
and the core that the consumer's thread drives (``_core``); the records handlers receive
(``_record``); offset maps (``_offsets``), work-item sizing (``_sizing``), failure decisions
(``_failures``) and the validated ``Options`` (``_options``). ``_shards``, ``_partition``,
``_scheduler``, ``_core`` and ``_record`` are compiled with mypyc at install when possible;
``_compiled`` chooses the compiled or the pure-Python modules, before any of them is imported.
"""

from sdk.engine import _compiled  # noqa: F401 - chooses the compiled or the pure core first
