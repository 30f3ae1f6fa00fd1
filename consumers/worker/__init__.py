"""The worker role (``duetime worker``): runs execution requests with fenced leases.

Modules: ``settings`` (configuration), ``service`` (the process and its loop), ``execution``
(one execution's path), ``leases`` (PostgreSQL), ``targets`` (http, python, kafka),
``kafka_io`` (threads around librdkafka), ``offsets`` (in-order commits), ``results``
(outcomes and result records), ``metrics``. Importing this package imports none of them.
"""
