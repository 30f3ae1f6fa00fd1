"""The PostgreSQL projector: every event topic → the queryable tables, exactly once.

``duetime projector`` runs :class:`~.service.Projector`; ``--rebuild`` empties the projection
and replays the topics. Pure row mapping is in ``rows``, PostgreSQL in ``store``.
"""
