"""The SQLite datastore: versioned, immutable data; compare-and-swap transitions; queries; GC."""

from swamp.store.datastore import Datastore, Key, Record, SpecPolicy

__all__ = ["Datastore", "Key", "Record", "SpecPolicy"]
