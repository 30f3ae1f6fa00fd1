"""Roles as real processes for end-to-end tests: the shared harness
(:mod:`duetime.infra.harness`) under the names these tests know."""

from __future__ import annotations

from duetime.infra.harness import LOG_DIR, RoleProc, role_env

Role = RoleProc
"""``Role.start(name, argv, env)``; ``kill``, ``pause``/``resume``, ``stop``, ``log``."""

__all__ = ["LOG_DIR", "Role", "role_env"]
