"""A routing sidecar for the P/D lab: llm-d's prefill and decode legs in front of a decode mock.

See :mod:`~ppc_extproc_lab.pd_sidecar.proxy` for the protocol and
:mod:`~ppc_extproc_lab.pd_sidecar.legs` for the leg bodies. Importing this package starts nothing.
"""

from __future__ import annotations

from ppc_extproc_lab.pd_sidecar.proxy import CONNECTORS, PREFILL_HEADER, SidecarOptions, create_sidecar_app

__all__ = ["CONNECTORS", "PREFILL_HEADER", "SidecarOptions", "create_sidecar_app"]
