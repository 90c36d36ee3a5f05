"""Session bindings: a bounded, expiring local table, optionally shared by router replicas through
Valkey or Redis (``SessionBindings``). The session-affinity plugins build on it."""

from __future__ import annotations

from ppc_extproc.sessions.bindings import SessionBindings, StoreConfig, StoreStats
from ppc_extproc.sessions.table import BindingTable, session_key

__all__ = ["BindingTable", "SessionBindings", "StoreConfig", "StoreStats", "session_key"]
