"""The client: one event loop, or a level spread over several processes (ClientPool), each
with its own loop and session, all starting a window at one instant."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Literal

from orchestrator import TaskError
from tasks.benchmark.params import (
    START_MARGIN,
    STREAMS_PER_PROCESS,
    BenchParams,
    Outcome,
    Prompt,
    Target,
)
from tasks.benchmark.request import one_request
from tasks.benchmark.windows import ClientLoad, progress_line, run_window

# One window of a level's load generator, by its label: every answer in request order, the
# window's duration, and each client process's load over it.
WindowRun = Callable[[str], Awaitable[tuple[list[Outcome], float, list[ClientLoad]]]]


@contextlib.asynccontextmanager
async def client_session(target: Target, p: BenchParams, streams: int) -> AsyncIterator[Any]:
    """An aiohttp session holding at most `streams` connections, each kept for the next
    request where the engine keeps it too (its adapter's `keep_alive`)."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=p.request_timeout)
    connector = aiohttp.TCPConnector(limit=streams, force_close=not target.adapter.keep_alive)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        yield session


async def warm_up(
    session: Any, target: Target, warm: Sequence[Prompt], p: BenchParams, concurrency: int
) -> None:
    """The warm-up's requests, all at once; one failing fails the level."""
    for outcome in await asyncio.gather(*(one_request(session, target, w, p) for w in warm)):
        if not outcome.ok:
            raise TaskError(f"warm-up request failed at c={concurrency}: {outcome.error}")


def client_processes(
    setting: int | Literal["auto"], concurrency: int, requests: int, cpus: int
) -> int:
    """How many processes the load generator spreads a level over. auto: one per
    STREAMS_PER_PROCESS streams begun (so one while the concurrency is at most that: in this
    process, as before), at most `cpus` (the CPUs it may run on: more loops than cores would
    share them, and one process saturated is a window refused). Never more than the streams or
    the requests to share out: every process sends at least one of each."""
    wanted = (
        min(math.ceil(concurrency / STREAMS_PER_PROCESS), cpus) if setting == "auto" else setting
    )
    return max(1, min(wanted, concurrency, requests))


def shares(total: int, n: int) -> list[int]:
    """`total` shared out among `n`, the shares differing by at most one (the larger first, as
    a list's [w::n] slices are)."""
    return [total // n + (w < total % n) for w in range(n)]


@contextlib.asynccontextmanager
async def clients(
    target: Target,
    prompts: list[Prompt],
    p: BenchParams,
    concurrency: int,
    progress: Callable[[str], None] | None = None,
    every: float = 10.0,
) -> AsyncIterator[WindowRun]:
    """A level's load generator, warmed up: one window at a time, each of `requests`
    requests, the prompts taken in turn. In this event loop, or, where `client_processes`
    says several, in a ClientPool's processes (ended with the level, however it ends)."""
    todo = [prompts[i % len(prompts)] for i in range(p.requests)]
    cpus = sorted(os.sched_getaffinity(0))  # this thread's: after `cpus` pinning (pinned)
    n = client_processes(p.client_processes, concurrency, p.requests, len(cpus))
    # Each process warms its own session (its first request's one-off costs stay out of its
    # windows): at least one warm-up request each, where there is a warm-up.
    warm = [prompts[i % len(prompts)] for i in range(max(p.warmup, n) if p.warmup else 0)]
    if n > 1:
        async with ClientPool(n, target, todo, warm, p, concurrency, cpus) as pool:
            yield lambda label: pool.window(label, progress, every)
        return
    async with client_session(target, p, concurrency) as session:
        await warm_up(session, target, warm, p, concurrency)

        async def window(label: str) -> tuple[list[Outcome], float, list[ClientLoad]]:
            started = time.perf_counter()

            def tally(done: int, tokens: int) -> None:
                if progress is not None:
                    elapsed = time.perf_counter() - started
                    progress(progress_line(label, done, len(todo), tokens, elapsed))

            outcomes, duration, load = await run_window(
                session, target, todo, p, concurrency, tally if progress else None, every
            )
            return outcomes, duration, [load]

        yield window


@dataclass
class ClientJob:
    """What one client process is given for a level (pickled to it)."""

    target: Target
    todo: list[Prompt]  # its share of every window's requests, in their order
    warm: list[Prompt]  # its share of the warm-up
    p: BenchParams
    streams: int  # its share of the concurrency
    concurrency: int  # the level's
    cpus: list[int]  # where it runs: the client's CPUs (`cpus`), as the parent's


# A client process is a fresh interpreter (fork + exec, as subprocess starts any program): never
# a fork of this process, which may have threads (orch's own, aiohttp's resolver); and unlike
# multiprocessing's spawn or forkserver, nothing else is started (a resource tracker, a fork
# server) that would outlive the level. It talks to its parent over a socket pair, in pickles.
CLIENT_PROCESS = (
    "import sys; sys.path.insert(0, {root!r}); "
    "from tasks.benchmark.pool import client_process; client_process(int(sys.argv[1]))"
)


class ClientPool:
    """A level's load generator spread over `n` processes, kept for the level: each warms up,
    then runs its share of every window from the instant it is sent (CLOCK_MONOTONIC), and
    answers with its outcomes, when it ended and its ClientLoad. Ended on leaving, however the
    level ends (told to stop; on an error or interrupt, terminated); one that dies fails the
    level."""

    def __init__(
        self,
        n: int,
        target: Target,
        todo: list[Prompt],
        warm: list[Prompt],
        p: BenchParams,
        concurrency: int,
        cpus: list[int],
    ) -> None:
        self.n, self.todo, self.concurrency = n, todo, concurrency
        streams = shares(concurrency, n)
        self.jobs = [
            ClientJob(target, todo[w::n], warm[w::n], p, streams[w], concurrency, cpus)
            for w in range(n)
        ]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.conns: list[Connection] = []

    async def __aenter__(self) -> ClientPool:
        try:
            code = CLIENT_PROCESS.format(root=str(Path(__file__).resolve().parent.parent))
            for _ in range(self.n):
                ours, theirs = socket.socketpair()
                with theirs:
                    self.procs.append(
                        subprocess.Popen(
                            [sys.executable, "-P", "-c", code, str(theirs.fileno())],
                            pass_fds=[theirs.fileno()],
                            stdin=subprocess.DEVNULL,
                        )
                    )
                self.conns.append(Connection(ours.detach()))
            for conn, job in zip(self.conns, self.jobs, strict=True):  # all started: no waits
                conn.send(job)
            await self._answers("ready")
        except BaseException:
            self.end(graceful=False)
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.end(graceful=exc[0] is None)

    async def window(
        self, label: str, progress: Callable[[str], None] | None, every: float
    ) -> tuple[list[Outcome], float, list[ClientLoad]]:
        start = time.monotonic() + START_MARGIN
        for conn in self.conns:
            conn.send((start, every if progress else None))
        # A progress line once every process still at it has told how far it is: their
        # tallies come every `every` s from the same instant.
        tallies, told, finished = [(0, 0)] * self.n, set[int](), set[int]()

        def heard(w: int, said: str, what: list[Any]) -> None:
            if said == "tally":
                tallies[w] = (what[0], what[1])
            else:
                tallies[w] = (len(what[0]), sum(o.output_tokens for o in what[0]))
                finished.add(w)
            told.add(w)
            if progress is not None and said == "tally" and len(told | finished) == self.n:
                done, tokens = (sum(x) for x in zip(*tallies, strict=True))
                elapsed = time.monotonic() - start
                progress(progress_line(label, done, len(self.todo), tokens, elapsed))
                told.clear()

        answers = await self._answers("window", heard)
        # Each process sent the requests todo[w::n]: interleaved back, they are in order.
        rows = itertools.zip_longest(*(a[0] for a in answers))
        outcomes = [o for row in rows for o in row if o is not None]
        loads = [replace(a[2], pid=proc.pid) for a, proc in zip(answers, self.procs, strict=True)]
        return outcomes, max(a[1] for a in answers) - start, loads

    async def _answers(
        self, kind: str, heard: Callable[[int, str, list[Any]], None] | None = None
    ) -> list[Any]:
        """Every process's next answer of `kind`; `heard` hears it, and the tallies sent on
        the way. A process that failed or died fails the level."""
        got: dict[int, Any] = {}
        while len(got) < self.n:
            waiting = [c for w, c in enumerate(self.conns) if w not in got]
            await _readable(waiting)
            ready = wait(waiting, 0)
            for w in [w for w, c in enumerate(self.conns) if c in ready]:
                try:
                    said, *what = self.conns[w].recv()
                except (EOFError, OSError):
                    raise TaskError(self._died(w)) from None
                if said == "failed":
                    why, expected = what
                    if expected:
                        raise TaskError(why)
                    raise RuntimeError(f"client process {w + 1} of {self.n} failed: {why}")
                if said == kind:
                    got[w] = what
                if heard is not None:
                    heard(w, said, what)
        return [got[w] for w in range(self.n)]

    def _died(self, w: int) -> str:
        proc = self.procs[w]
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=2)
        return (
            f"c={self.concurrency}: client process {w + 1} of {self.n} (pid {proc.pid}) "
            f"ended mid-level (exit status {proc.returncode})"
        )

    def end(self, graceful: bool) -> None:
        """Every process ended and reaped: told to stop (graceful), else terminated; killed if
        it has not ended within a few seconds."""
        for conn in self.conns:
            with contextlib.suppress(OSError):
                if graceful:
                    conn.send(None)
                conn.close()  # a process waiting or mid-window sees it closed, and ends
        for proc in self.procs:
            if not graceful:
                proc.terminate()
        deadline = time.monotonic() + 5
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def _readable(conns: Sequence[Connection]) -> None:
    """Until one of `conns` can be read (a message, or its other end closed), with the event
    loop free meanwhile (no thread)."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    for conn in conns:
        loop.add_reader(conn.fileno(), wake)
    try:
        await ready
    finally:
        for conn in conns:
            loop.remove_reader(conn.fileno())


def client_process(fd: int) -> None:
    """A client process of a ClientPool: its ClientJob, then a window at each instant it is
    sent, until told to stop or its parent is gone (its end of the socket closed)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the group: the parent ends us
    conn = Connection(fd)
    try:
        job: ClientJob = conn.recv()
        os.sched_setaffinity(0, job.cpus)
        asyncio.run(_client_windows(conn, job))
    except (EOFError, ConnectionError, asyncio.CancelledError):
        pass  # the parent is gone, and the level with it
    except TaskError as exc:
        with contextlib.suppress(OSError):
            conn.send(("failed", str(exc), True))
    except Exception:
        with contextlib.suppress(OSError):
            conn.send(("failed", traceback.format_exc(), False))


async def _client_windows(conn: Connection, job: ClientJob) -> None:
    loop = asyncio.get_running_loop()
    async with client_session(job.target, job.p, job.streams) as session:
        await warm_up(session, job.target, job.warm, job.p, job.concurrency)
        conn.send(("ready",))
        while True:
            await _readable([conn])
            if (sent := conn.recv()) is None:
                return
            start, every = sent
            await asyncio.sleep(start - time.monotonic())

            def tally(done: int, tokens: int) -> None:
                conn.send(("tally", done, tokens))

            window = asyncio.ensure_future(
                run_window(
                    session,
                    job.target,
                    job.todo,
                    job.p,
                    job.streams,
                    tally if every else None,
                    every or 10.0,
                )
            )
            loop.add_reader(conn.fileno(), window.cancel)  # mid-window only its parent's end
            try:
                outcomes, _, load = await window
            finally:
                loop.remove_reader(conn.fileno())
            conn.send(("window", outcomes, time.monotonic(), load))
