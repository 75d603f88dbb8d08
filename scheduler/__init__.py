"""A Redis-centric placement scheduler: shared state, atomic Lua decisions."""

from scheduler.aio import AsyncScheduler
from scheduler.client import Scheduler
from scheduler.errors import (
    FailedPrecondition,
    InvalidArgument,
    NoNodesAvailable,
    NotFound,
    PolicyConflict,
    SchedulerError,
    StoreUnavailable,
    UnknownNode,
)
from scheduler.policy import DefaultRequest, Limits, Overcommit, Policy
from scheduler.records import Heartbeat, MachineInfo, NodeSnapshot, Request, SandboxEvent

__all__ = [
    "AsyncScheduler",
    "DefaultRequest",
    "FailedPrecondition",
    "Heartbeat",
    "InvalidArgument",
    "Limits",
    "MachineInfo",
    "NoNodesAvailable",
    "NodeSnapshot",
    "NotFound",
    "Overcommit",
    "Policy",
    "PolicyConflict",
    "Request",
    "SandboxEvent",
    "Scheduler",
    "SchedulerError",
    "StoreUnavailable",
    "UnknownNode",
]
