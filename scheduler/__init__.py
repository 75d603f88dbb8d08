"""A Redis-centric placement scheduler: shared state, atomic Lua decisions."""

from scheduler.client.aio import AsyncScheduler
from scheduler.client.sync import Scheduler
from scheduler.domain.errors import (
    FailedPrecondition,
    IndexBehind,
    InvalidArgument,
    NoNodesAvailable,
    NotFound,
    PolicyConflict,
    SchedulerError,
    StoreUnavailable,
    UnknownNode,
)
from scheduler.domain.policy import DefaultRequest, Limits, Overcommit, Policy
from scheduler.domain.records import Heartbeat, MachineInfo, NodeSnapshot, Request, SandboxEvent

__all__ = [
    "AsyncScheduler",
    "DefaultRequest",
    "FailedPrecondition",
    "Heartbeat",
    "IndexBehind",
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
