"""The lab around ppc-extproc: everything that is not the product but exercises it.

Shipped in the same distribution so ``ppc-extproc demo`` and ``ppc-extproc mock-vllm`` work from
an install, but the product package :mod:`ppc_extproc` never imports it (only its command line
hands those two subcommands over; ``tests/unit/test_layering.py`` enforces this).

* :mod:`~ppc_extproc_lab.mock_vllm` — a mock vLLM engine (HTTP API and KV events);
* :mod:`~ppc_extproc_lab.workload` — the shared-prefix workload, its runner, reports and policies;
* :mod:`~ppc_extproc_lab.localcluster` — Envoy, engines and the service on loopback;
* :mod:`~ppc_extproc_lab.demo` — ``ppc-extproc demo``;
* :mod:`~ppc_extproc_lab.soak` — the eviction soak shared by a reliability test and a benchmark;
* :mod:`~ppc_extproc_lab.tiny_tokenizer` — a small HF tokenizer directory built at run time.
"""
