"""A ring of the last N items, numbered as they come: the stream adds in O(1), pages read what is new."""

from __future__ import annotations

import threading
from typing import Generic, TypeVar

__all__ = ["Ring"]

T = TypeVar("T")


class Ring(Generic[T]):
    """The last ``capacity`` items; item *n* is the *n*-th added (from 0).

    The stream's thread adds, the page's threads read: a lock (uncontended: tens of nanoseconds)
    keeps a reader from seeing a slot half-replaced. Memory is the capacity's, however long it runs.
    """

    def __init__(self, capacity: int) -> None:
        assert capacity > 0, f"a ring holds at least one item, not {capacity}"
        self._items: list[T | None] = [None] * capacity
        self._next = 0
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int:
        return len(self._items)

    @property
    def added(self) -> int:
        """Items added so far (the next item's number)."""
        return self._next

    def add(self, item: T) -> None:
        with self._lock:
            self._items[self._next % len(self._items)] = item
            self._next += 1

    def since(self, cursor: int | None) -> tuple[list[T], int]:
        """The items numbered ``cursor`` on that are still kept, and the cursor to read from next.
        None, or a cursor past the end (a page left open over a restart), reads all that is kept."""
        with self._lock:
            end, size = self._next, len(self._items)
            start = max(end - size, 0 if cursor is None or cursor > end else cursor)
            return [self._items[n % size] for n in range(start, end)], end  # type: ignore[misc]
