"""The embedded default's broker: kombu's filesystem transport, made safe for several
processes publishing and consuming at once (issue 25).

Stock kombu (5.7) creates a message file under its final name and then writes into it,
and its reader moves and parses whatever file it finds. A reader that comes by between
the two gets a half-written (often empty) file, `json.loads` raises, and Celery's
consumer dies with "Unrecoverable error: JSONDecodeError('Expecting value ...')"
(kombu issue 1551). Its exchange tables (the control folder) are truncated before they
are locked and rewritten, with the same effect on their readers. Here:

1. A message is written under a hidden temporary name in the same folder, then renamed
   to its final name with `os.replace`: a reader sees all of it or nothing of it.
2. A reader claims a file by renaming it into `.claimed/` beside the queue (a rename
   is atomic: of two readers one wins, the other moves on to the next file) and then
   reads it. A file that does not parse into a message (damaged, or written by
   something else) goes to the `bad` folder with a warning and is skipped, never
   raised: a message is only a wake-up, and the sweeper re-sends what is lost.
3. An exchange table is rewritten under a lock file into a temporary file that
   replaces the old one; an unreadable table is logged and treated as empty.

Registered as the kombu transport `airlockfs` (config/celery.py); the options are the
stock ones plus `bad_folder` (default: `bad` beside the queue folder).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from queue import Empty
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import TRANSPORT_ALIASES, filesystem, virtual
from kombu.transport.filesystem import exchange_queue_t
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads
from kombu.utils.objects import cached_property

log = logging.getLogger("airlock.broker")

ALIAS = "airlockfs"
CLAIMED = ".claimed"


def write_atomically(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` so that no reader ever sees part of it: a temporary file
    in the same folder (same file system, so the rename is atomic), then os.replace.
    No fsync: after a power cut a lost wake-up costs a sweep, not a run."""
    path = os.fspath(path)
    folder, name = os.path.split(path)
    # A leading dot and no ".msg" ending: the readers' filter never matches it.
    temp = os.path.join(folder, f".{name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(temp, "wb") as f:
            f.write(data)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


class Channel(filesystem.Channel):
    """The filesystem channel with atomic writes and readers that skip bad files."""

    # -- messages ----------------------------------------------------------------

    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        path = os.path.join(self.data_folder_out, name)
        try:
            write_atomically(path, str_to_bytes(dumps(payload)))
        except OSError as exc:
            raise ChannelError(f"Cannot add file {path!r} to directory") from exc

    def _get(self, queue: str) -> Any:
        wanted = f"{queue}.msg"
        claimed_folder = self.claimed_folder
        for filename in sorted(os.listdir(self.data_folder_in)):
            if filename.partition(".")[2] != wanted:
                continue
            claimed = os.path.join(claimed_folder, filename)
            try:
                os.rename(os.path.join(self.data_folder_in, filename), claimed)
            except FileNotFoundError:
                continue  # another consumer claimed it first: it is theirs
            try:
                with open(claimed, "rb") as f:
                    raw = f.read()
                payload = loads(bytes_to_str(raw))
                self.Message(payload, channel=self)  # what the consumer will build from it
            except Exception as exc:  # noqa: BLE001 - any unreadable file is skipped, never fatal
                self._quarantine(claimed, filename, exc)
                continue
            self._done_with(claimed, filename)
            return payload
        raise Empty()

    def _quarantine(self, claimed: str, filename: str, exc: BaseException) -> None:
        bad = self.bad_folder
        try:
            bad.mkdir(parents=True, exist_ok=True)
            os.replace(claimed, bad / filename)
            where = f"moved to {bad / filename}"
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(claimed)
            where = "removed"
        log.warning(
            "broker: skipped unreadable message file %s (%s: %s), %s; the sweeper re-sends lost wake-ups",
            filename, type(exc).__name__, str(exc)[:200], where,
        )  # fmt: skip

    def _done_with(self, claimed: str, filename: str) -> None:
        try:
            if self.store_processed:
                folder = Path(self.processed_folder)
                folder.mkdir(parents=True, exist_ok=True)
                os.replace(claimed, folder / filename)
            else:
                os.unlink(claimed)
        except OSError as exc:
            log.warning("broker: could not clear the claimed file %s (%s)", claimed, exc)

    @cached_property
    def claimed_folder(self) -> str:
        # Inside the queue folder, so the claiming rename never crosses file systems
        # (stock kombu moves files to /tmp, a copy when /tmp is another file system).
        folder = os.path.join(self.data_folder_in, CLAIMED)
        os.makedirs(folder, exist_ok=True)
        return folder

    @cached_property
    def bad_folder(self) -> Path:
        default = Path(self.data_folder_in).resolve().parent / "bad"
        return Path(self.transport_options.get("bad_folder") or default)

    # -- exchange tables (bindings, in the control folder) ---------------------------

    def get_table(self, exchange: str) -> list[exchange_queue_t]:
        file = self._exchange_file(exchange)
        try:
            raw = file.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise ChannelError(f"Cannot open {file}") from exc
        return _parse_table(raw, file)

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        entry = exchange_queue_t(routing_key or "", pattern or "", queue or "")

        def add(queues: list[exchange_queue_t]) -> list[exchange_queue_t] | None:
            return None if entry in queues else [entry, *queues]

        self._update_table(exchange, add)

    def _delete(self, queue: str, exchange: str, routing_key: str, pattern: str, *args: Any, **kwargs: Any) -> None:
        # The virtual channel's bookkeeping, not the stock filesystem one (it rewrites
        # the table in place).
        virtual.Channel._delete(self, queue, exchange, routing_key, pattern, *args, **kwargs)
        entry = exchange_queue_t(routing_key or "", pattern or "", queue or "")

        def remove(queues: list[exchange_queue_t]) -> list[exchange_queue_t] | None:
            return [q for q in queues if q != entry] if entry in queues else None

        self._update_table(exchange, remove)

    def _update_table(
        self, exchange: str, change: Callable[[list[exchange_queue_t]], list[exchange_queue_t] | None]
    ) -> None:
        """Read, change and replace one exchange table; writers take turns on a lock
        file (the table itself is replaced, so a lock on it would not hold), readers
        need no lock at all."""
        file = self._exchange_file(exchange)
        try:
            self.control_folder.mkdir(parents=True, exist_ok=True)
            with _locked(file.with_name(file.name + ".lock")):
                try:
                    current = _parse_table(file.read_bytes(), file)
                except FileNotFoundError:
                    current = []
                changed = change(current)
                if changed is not None:
                    write_atomically(file, str_to_bytes(dumps(changed)))
        except OSError as exc:
            raise ChannelError(f"Cannot update {file}") from exc


def _parse_table(raw: bytes, file: Path) -> list[exchange_queue_t]:
    try:
        return [exchange_queue_t(*q) for q in loads(bytes_to_str(raw))]
    except Exception as exc:  # noqa: BLE001 - a damaged table is an empty one, logged
        log.warning("broker: unreadable exchange table %s (%s: %s), treated as empty", file, type(exc).__name__, exc)
        return []


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


class Transport(filesystem.Transport):
    Channel = Channel
    driver_type = "filesystem"
    driver_name = "filesystem"


def register() -> None:
    """Make `airlockfs://` a kombu transport in this process."""
    TRANSPORT_ALIASES.setdefault(ALIAS, f"{__name__}:Transport")
