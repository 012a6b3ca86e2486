"""The store: the source of truth for definitions, instances, history and decisions.

`port` defines what the rest of taskstream may ask of it (`Store`) and re-exports the records it
takes and returns (`records`); `sql` is the adapter over SQLAlchemy Core.
"""
