"""Task modules of the two worker pools of ``tests/e2e/test_queue_pools.py``: each pool may
import only its own (``DUETIME_WORKER_PYTHON_MODULES``), so a job reaching the wrong pool
cannot run there."""
