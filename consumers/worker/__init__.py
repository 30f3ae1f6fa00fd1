"""The worker role (``duetime worker``): runs execution requests with fenced leases.

Modules: ``settings`` (configuration), ``service`` (the process and its loop), ``execution``
(one execution's path), ``leases`` (PostgreSQL), ``targets`` (http, python, kafka),
``http_target`` (the aiohttp session, egress checks, answer summaries), ``policy`` (what jobs
may reach: egress, topics, headers, secrets; pure), ``kafka_io`` (threads around librdkafka),
``offsets`` (in-order commits), ``results`` (outcomes and result records), ``metrics``.
Importing this package imports none of them.
"""
