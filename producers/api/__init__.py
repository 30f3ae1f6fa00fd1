"""The REST API (``duetime api``): API.md's routes on FastAPI.

Writes go to Kafka through :class:`~duetime.producers.sdk.JobClient` (the SDK's validation and
encoding); reads come from the PostgreSQL projection. ``app.create_app(settings)`` builds the
application; nothing happens at import time.
"""
