"""The creation step of an outbox batch: the rows of many emits in one store transaction, and
each row on its own when the store refuses that transaction for one row's value."""

from __future__ import annotations

from collections.abc import Sequence

from taskstream.core.errors import StoreUnavailable
from taskstream.core.store.port import CreateResult, NewInstance, Store

Outcome = CreateResult | Exception
"""What creating one instance came to: its result, or the error that kept it from being
created (nothing was written for it)."""


async def create_batch(
    store: Store, news: Sequence[NewInstance], tokens: Sequence[int | None]
) -> list[Outcome]:
    """`store.create_instances(news, tokens=tokens)`, one outcome per instance, in order.

    An outage fails every instance. Any other error of a batch of several (a value the store
    refuses, such as a dedupe key holding a NUL, which PostgreSQL's text cannot) is met by
    creating the instances one at a time, so that only those refused fail, not every emit
    batched with them, tick after tick. An outage met on the way fails the rest."""
    try:
        return list(await store.create_instances(news, tokens=tokens))
    except Exception as exc:  # the batch's callers learn of it, or each of its own
        if len(news) == 1 or isinstance(exc, StoreUnavailable):
            return [exc] * len(news)
    outcomes: list[Outcome] = []
    for new, token in zip(news, tokens, strict=True):
        try:
            outcomes.extend(await store.create_instances([new], tokens=[token]))
        except StoreUnavailable as exc:
            return outcomes + [exc] * (len(news) - len(outcomes))
        except Exception as exc:  # this instance's caller learns of it
            outcomes.append(exc)
    return outcomes
