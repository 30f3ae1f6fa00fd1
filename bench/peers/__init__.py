"""duetime's peers, measured on the same box with the same workloads: Celery and River.

``python -m bench.peers.run --scenario burst|sustained ...``; see bench/peers/README.md.
Importing this package starts nothing.
"""
