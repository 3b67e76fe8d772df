"""The memory planner: lifetimes, in-place results, offsets [KernelRuntime::AssignMemory]."""

from .inplace import AliasDecision, choose_aliases
from .lifetimes import Buffer, buffers, live_bytes
from .plan import MemoryPlan, plan_memory

__all__ = [
    "AliasDecision",
    "Buffer",
    "MemoryPlan",
    "buffers",
    "choose_aliases",
    "live_bytes",
    "plan_memory",
]
