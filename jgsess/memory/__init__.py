"""The memory planner: lifetimes, in-place results, workspaces [KernelRuntime::AssignMemory]."""

from .inplace import AliasDecision, choose_aliases

__all__ = ["AliasDecision", "choose_aliases"]
