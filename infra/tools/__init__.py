"""Small repository checks kept next to the code they measure (run with ``python -m``)."""
