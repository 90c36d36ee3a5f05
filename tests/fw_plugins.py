"""Throwaway plugin types for the loader and router tests: producers that declare the data they
read and write, record when they ran (``ran(ctx)``) and can be made to fail.

Registered under ``fwtests-*`` names, each with the documentation every registered type carries
(``ppc-extproc plugins`` lists them while the tests run)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ppc_extproc.errors import BadRequestError
from ppc_extproc.framework import AsyncDataProducer, Consumes, DataProducer, DataType, SchedulingContext
from ppc_extproc.framework.params import Section
from ppc_extproc.plugins.registry import Services, register

__all__ = ["ran"]

#: Per request: the names of the test producers that ran, in order.
_RAN: DataType[list[str]] = DataType("FwRan")
_RAN_KEY = _RAN.of("fwtests")


def _record(ctx: SchedulingContext, name: str) -> None:
    names = ctx.get(_RAN_KEY)
    if names is None:
        names = []
        ctx.put(_RAN_KEY, names)
    names.append(name)


def ran(ctx: SchedulingContext) -> list[str]:
    """Names of the test producers that ran for this request, in order."""
    return list(ctx.get(_RAN_KEY) or [])


def _producer(
    type_name: str,
    produces: tuple[str, ...] = (),
    consumes: tuple[Consumes[object], ...] = (),
    fail: Callable[[], Exception] | None = None,
    hang_seconds: float | None = None,
) -> type:
    def init(self: Any, name: str) -> None:
        self.name = name

    def from_parameters(cls: Any, name: str, params: Section, services: Services) -> Any:
        return cls(name)

    def produce(self: Any, ctx: SchedulingContext) -> None:
        _record(ctx, self.name)
        if fail is not None:
            raise fail()

    async def produce_async(self: Any, ctx: SchedulingContext) -> None:
        _record(ctx, self.name)
        await asyncio.Event().wait()  # never set: only the step's timeout ends it

    namespace: dict[str, Any] = {
        "__doc__": f"``{type_name}``: a test producer.\n\nType        ``{type_name}`` (producer)\n"
        f"Parameters  none\n\n    plugins:\n    - type: {type_name}\n",
        "__init__": init,
        "from_parameters": classmethod(from_parameters),
        "produces": lambda self: frozenset(DataType(t).of(self.name) for t in produces),
        "consumes": lambda self: consumes,
    }
    if hang_seconds is None:
        namespace["produce"] = produce
        base: type = DataProducer
    else:
        namespace["produce_async"] = produce_async
        namespace["produce_timeout_seconds"] = hang_seconds
        base = AsyncDataProducer
    return register(type_name)(type(type_name.replace("-", "_"), (base,), namespace))


# A → B → C, A → D, E alone (llm-d's data_graph_test.go DAG)
_producer("fwtests-a", produces=("FwA",))
_producer("fwtests-b", produces=("FwB",), consumes=(Consumes(DataType("FwA")),))
_producer("fwtests-c", consumes=(Consumes(DataType("FwB")),))
_producer("fwtests-d", consumes=(Consumes(DataType("FwA")),))
_producer("fwtests-e")
# X ⇄ Y
_producer("fwtests-x", produces=("FwX",), consumes=(Consumes(DataType("FwY")),))
_producer("fwtests-y", produces=("FwY",), consumes=(Consumes(DataType("FwX")),))
# needs data nobody produces
_producer("fwtests-needs-nobody", consumes=(Consumes(DataType("FwNobody")),))
_producer("fwtests-may-need-nobody", consumes=(Consumes(DataType("FwNobody"), required=False),))
# F fails → G (reads F) → H (reads G); I is independent
_producer("fwtests-f", produces=("FwF",), fail=lambda: RuntimeError("producer broke"))
_producer("fwtests-g", produces=("FwG",), consumes=(Consumes(DataType("FwF")),))
_producer("fwtests-h", consumes=(Consumes(DataType("FwG")),))
_producer("fwtests-i")
_producer("fwtests-bad-request", fail=lambda: BadRequestError("messages[0].content: expected a string"))
# hangs until its 10 ms timeout; J reads its data
_producer("fwtests-hang", produces=("FwHang",), hang_seconds=0.01)
_producer("fwtests-j", consumes=(Consumes(DataType("FwHang")),))
