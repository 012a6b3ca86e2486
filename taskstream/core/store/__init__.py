"""The store: the source of truth for definitions, instances, history and decisions."""

from taskstream.core.store.port import (
    CasResult,
    Claim,
    Claimed,
    ClaimRequest,
    CreateResult,
    DecisionRow,
    DefinitionRecord,
    FinishRequest,
    HistoryRow,
    InstanceRow,
    NewInstance,
    Store,
)

__all__ = [
    "CasResult",
    "Claim",
    "ClaimRequest",
    "Claimed",
    "CreateResult",
    "DecisionRow",
    "DefinitionRecord",
    "FinishRequest",
    "HistoryRow",
    "InstanceRow",
    "NewInstance",
    "Store",
]
