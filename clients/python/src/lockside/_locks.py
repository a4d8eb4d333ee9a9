"""Several locks taken together (`lock_all`), as both clients hold them: `LocksBase`
(the locks in the order asked, each key's fencing token, giving them all back); the
sync `Locks` and the `AsyncLocks` add the context managers. No I/O of their own:
each key is an ordinary `Lock` / `AsyncLock`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Generic, Iterator, List, Optional, Sequence, TypeVar, Union, overload

from lockside._errors import LocksideError
from lockside._lock import LockBase

if TYPE_CHECKING:
    from lockside._aio import AsyncLock
    from lockside._sync import Lock

#: `Lock` (`Client`) or `AsyncLock` (`AsyncClient`).
L = TypeVar("L", bound=LockBase)


def keys_asked(keys: Any) -> List[str]:
    """`lock_all()`'s keys checked as far as they cannot be sent: a sequence of `str`
    (a single `str` is refused: it is a key, not keys). How many (2 to 64), distinct,
    and each a valid key: the sidecar's to check (it answers `Rejected`)."""
    if isinstance(keys, (str, bytes)) or not isinstance(keys, (list, tuple)):
        raise TypeError(f"keys must be a list or tuple of str, not {type(keys).__name__}")
    for key in keys:
        if not isinstance(key, str):
            raise TypeError(f"each key must be a str, not {type(key).__name__}")
        key.encode("utf-8")  # a lone surrogate: UnicodeEncodeError, a ValueError
    return list(keys)


class LocksBase(Generic[L]):
    """Several locks taken at once, all or none: one lock per key, in the order asked.

    `locks[key]` (or `locks[i]`) is the lock of one key, each with its own
    `fencing_token`, `suspended` and `lost`: pass each resource its own key's token
    (`fencing_tokens[key]`). Each is a lock of its own once granted: one may be lost
    while the others are held. `release()` (or leaving the `with` block) gives every
    one back.
    """

    def __init__(self, locks: Sequence[L]):
        self.locks: List[L] = list(locks)
        #: Each key's fencing token, in the order asked.
        self.fencing_tokens: Dict[str, int] = {lock.key: lock.fencing_token for lock in self.locks}

    @property
    def keys(self) -> List[str]:
        """The keys, in the order asked."""
        return [lock.key for lock in self.locks]

    @property
    def held(self) -> bool:
        """True while every lock is held (none released or lost)."""
        return all(lock.held for lock in self.locks)

    def usable(self) -> bool:
        """True while every lock may be used: held, and none suspended."""
        return all(lock._usable() for lock in self.locks)

    @overload
    def __getitem__(self, which: str) -> L: ...

    @overload
    def __getitem__(self, which: int) -> L: ...

    def __getitem__(self, which: Union[str, int]) -> L:
        if isinstance(which, str):
            for lock in self.locks:
                if lock.key == which:
                    return lock
            raise KeyError(which)
        return self.locks[which]

    def __iter__(self) -> Iterator[L]:
        return iter(self.locks)

    def __len__(self) -> int:
        return len(self.locks)

    def __contains__(self, key: object) -> bool:
        return any(lock.key == key for lock in self.locks)

    def _release_all(self) -> None:
        """Gives every lock back (each once its `Release` is on the stream); raises the
        first failure (`LockLost` for a lock lost before) after trying them all."""
        first: Optional[LocksideError] = None
        for lock in self.locks:
            try:
                lock._release()
            except LocksideError as e:
                first = first or e
        if first is not None:
            raise first

    def __repr__(self) -> str:
        shown = ", ".join(f"{lock.key!r}: {lock.fencing_token}" for lock in self.locks)
        return f"<{type(self).__name__} {{{shown}}}>"


class Locks(LocksBase["Lock"]):
    """The locks of `Client.lock_all`: a context manager that releases every one on
    exit; see `LocksBase`."""

    def release(self) -> None:
        """Gives every lock back; see `lockside.Lock.release`. Raises `LockLost` (once)
        if one was lost while held, after releasing the others."""
        self._release_all()

    def __enter__(self) -> "Locks":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self.release()
        except LocksideError as e:
            if exc_type is None:
                raise
            self.locks[0]._left_on(exc_type, e)


class AsyncLocks(LocksBase["AsyncLock"]):
    """The locks of `AsyncClient.lock_all`: an async context manager that releases
    every one on exit; see `LocksBase`."""

    async def release(self) -> None:
        """Gives every lock back; see `Locks.release`."""
        self._release_all()

    async def __aenter__(self) -> "AsyncLocks":
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            await self.release()
        except LocksideError as e:
            if exc_type is None:
                raise
            self.locks[0]._left_on(exc_type, e)
