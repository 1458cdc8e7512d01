"""Two threads that let an extraction use a second core: one decompresses ahead, one writes behind.

An install of the default sampler bundle streams about 90 MB through zstd and sha256 into 1,100
files. libzstd, hashlib and the file system calls run without the GIL, so decompressing the next
blocks (``ReadAhead``) and writing the previous files (``Writer``) while the reader parses and hashes
the current member uses a second core instead of waiting for it: on 2 cores, 0.39 s -> 0.22 s for
that bundle on tmpfs. Neither changes what is checked or what an error leaves:

* ``ReadAhead`` serves exactly the bytes, and raises exactly the errors, that reading ``raw``
  directly would, in the same order; it holds at most ``depth`` blocks of ``size`` bytes, so a
  bomb is still stopped by the frame's own cap, one bounded read at a time;
* ``Writer`` writes whole files in the order given, in batches (the GIL changes hands once per
  batch, not once per file), with at most ``ahead`` bytes waiting; its first ``OSError`` is raised
  by the next ``write`` or by ``close``, and ``abandon`` returns only once nothing is being written,
  so a caller discarding the directory after an error races nothing.
"""

from __future__ import annotations

import io
import os
import queue
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor


class ReadAhead(io.RawIOBase):
    """``raw``'s bytes; once ``start`` is called, read in a thread up to ``depth`` blocks of ``size`` bytes
    ahead of the reader. Before that they are read directly, so a reader may first tighten ``raw``'s cap on
    what it has seen (the bundle reader does, once the manifest says how much is coming)."""

    def __init__(self, raw: io.RawIOBase, size: int = 256 << 10, depth: int = 8):
        self.raw, self.size = raw, size
        self.blocks: queue.Queue[bytes | BaseException] = queue.Queue(depth)
        self.stopping = threading.Event()
        self.pending = memoryview(b"")
        self.failed: BaseException | None = None
        self.ended = False
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._fill, name="kernelcache-read-ahead", daemon=True)
        self.thread.start()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.thread is None:
            return self.raw.readinto(buffer)
        while not self.pending:
            if self.failed is not None:
                raise self.failed
            if self.ended:
                return 0
            self._take()
        view = memoryview(buffer).cast("B")
        count = min(len(view), len(self.pending))
        view[:count] = self.pending[:count]
        self.pending = self.pending[count:]
        return count

    def _take(self) -> None:
        item = self.blocks.get()
        if isinstance(item, BaseException):
            self.failed = item
        elif not item:
            self.ended = True
        else:
            self.pending = memoryview(item)

    def _fill(self) -> None:
        try:
            while not self.stopping.is_set():
                block = self.raw.read(self.size)
                self._put(block)
                if not block:
                    return
        except BaseException as exc:  # handed to the reader, which raises it where reading raw would have
            self._put(exc)

    def _put(self, item: bytes | BaseException) -> None:
        while not self.stopping.is_set():
            try:
                self.blocks.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def close(self) -> None:
        """Stop the thread (the reader may stop early: it found what it wanted, or an error)."""
        self.stopping.set()
        if self.thread is not None:
            self._drain()  # a put waiting on a full queue returns at once
            self.thread.join()
        super().close()

    def _drain(self) -> None:
        while True:
            try:
                self.blocks.get_nowait()
            except queue.Empty:
                return


class Writer:
    """Whole files written in one background thread, in order, into directories it makes as needed."""

    def __init__(self, batch_files: int = 64, batch_bytes: int = 4 << 20, ahead: int = 32 << 20):
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="kernelcache-writer")
        self.batch_files, self.batch_bytes, self.ahead = batch_files, batch_bytes, ahead
        self.batch: list[tuple[str, bytes]] = []
        self.size = 0
        self.waiting: deque[tuple[Future, int]] = deque()
        self.made: set[str] = set()

    def write(self, target: str, data: bytes) -> None:
        self.batch.append((target, data))
        self.size += len(data)
        if len(self.batch) >= self.batch_files or self.size >= self.batch_bytes:
            self._hand_off()

    def _hand_off(self) -> None:
        if self.batch:
            self.waiting.append((self.pool.submit(self._write_all, self.batch), self.size))
            self.batch, self.size = [], 0
        while self.waiting and (self.waiting[0][0].done() or sum(n for _, n in self.waiting) > self.ahead):
            self.waiting.popleft()[0].result()  # raises the writer's OSError here

    def _write_all(self, files: list[tuple[str, bytes]]) -> None:
        for target, data in files:
            folder = os.path.dirname(target)
            if folder not in self.made:
                os.makedirs(folder, exist_ok=True)
                self.made.add(folder)
            fd = new_file(target)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)

    def close(self) -> None:
        """Write what is left and wait for every file; raise the first error."""
        self._hand_off()
        try:
            while self.waiting:
                self.waiting.popleft()[0].result()
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Drop what has not started and wait for what has (the caller may then remove the directory)."""
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.waiting.clear()
        self.batch = []


def new_file(target: str) -> int:
    """A descriptor for writing ``target``, which must not exist yet (nor be a link): a member is written once."""
    return os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
