"""The job, execution, DAG and DLQ commands of ``duetime``: a small client of the REST API.

``duetime jobs|executions|dags|dlq …`` talk to the API at ``DUETIME_API_URL`` (default
``http://127.0.0.1:8080``) with ``DUETIME_API_TOKEN`` when set; readable tables by default,
``--json`` for scripts. Only argparse and httpx: starting the CLI loads nothing heavy.
"""
