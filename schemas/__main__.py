"""``python -m duetime.schemas check|freeze [SCHEMA_DIR]`` (see :mod:`duetime.schemas.cli`)."""

from duetime.schemas.cli import main

raise SystemExit(main())
