"""The DAG resolver role (``duetime resolver``): releases and skips DAG members as results arrive.

``progress`` is the pure transform; ``app`` wires it into a faust-streaming application over
the results, dead-letter and dag_runs topics; ``cli`` is the command's entry point.
"""
