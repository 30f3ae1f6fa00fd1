"""duetime's benchmarks: ``./run bench <scenario>`` (see bench/README.md)."""
