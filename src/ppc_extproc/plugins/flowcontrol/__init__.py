"""Flow-control plugins: fairness, ordering, usage-limit, saturation and admission policies
(``llm-d/llm-d-router: pkg/epp/framework/plugins/flowcontrol/``). Importing registers them."""

from ppc_extproc.plugins.flowcontrol import admitter, detectors, fairness, ordering, program_aware, usage_limits

__all__ = ["admitter", "detectors", "fairness", "ordering", "program_aware", "usage_limits"]
