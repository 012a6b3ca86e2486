"""The store: the source of truth for definitions, instances, history and decisions."""

from taskstream.core.store.port import (
    CasResult,
    Claim,
    CreateResult,
    DecisionRow,
    DefinitionRecord,
    HistoryRow,
    InstanceRow,
    NewInstance,
    Store,
)

__all__ = [
    "CasResult",
    "Claim",
    "CreateResult",
    "DecisionRow",
    "DefinitionRecord",
    "HistoryRow",
    "InstanceRow",
    "NewInstance",
    "Store",
]
