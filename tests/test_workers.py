"""kssched.workers on its own: which worker takes a connection after an answer, and
how a connection is closed after its answer. The whole worker, under gunicorn, is
tested in test_listeners and test_slow_clients."""

import os
import select
import socket
import time

import pytest

from kssched import workers
from kssched.workers import (
    GRACE,
    HANDOVER,
    HANDOVER_STEP,
    DeadlineSocket,
    LastAnswer,
)


class Clock:
    """A stand-in for `time` in kssched.workers: sleeping moves the clock on, and
    may let another worker act (`on_sleep`)."""

    def __init__(self, on_sleep=None):
        self.now = 1000.0
        self.sleeps = 0
        self.on_sleep = on_sleep

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += seconds
        if self.on_sleep:
            self.on_sleep(self.sleeps)


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(workers, "time", clock)
    return clock


def test_a_worker_waits_for_the_one_that_just_answered_to_come_back_and_take_it(clock):
    last = LastAnswer()
    last.sending(1)

    def other_worker(sleeps):
        if sleeps == 3:
            last.waiting(1)
        if sleeps == 5:
            last.took(1)

    clock.on_sleep = other_worker
    last.give_way(2)
    assert clock.sleeps == 5


def test_a_worker_waits_no_longer_than_the_handover(clock):
    last = LastAnswer()
    last.sending(1)
    last.give_way(2)
    assert clock.sleeps == pytest.approx(HANDOVER / HANDOVER_STEP, abs=1.5)


def test_a_worker_waits_no_longer_than_the_grace_once_the_other_one_is_back(clock):
    last = LastAnswer()
    last.sending(1)
    clock.on_sleep = lambda sleeps: sleeps == 2 and last.waiting(1)
    last.give_way(2)
    # Two steps on its way back, then GRACE for it to take the connection.
    assert clock.sleeps - 2 == pytest.approx(GRACE / HANDOVER_STEP, abs=1.5)


def test_a_worker_waits_for_whichever_worker_answered_last(clock):
    last = LastAnswer()
    last.sending(1)
    clock.on_sleep = lambda sleeps: sleeps == 2 and last.sending(3)
    last.give_way(2)
    # Two steps for worker 1, then HANDOVER for worker 3, which answered meanwhile.
    assert clock.sleeps - 2 == pytest.approx(HANDOVER / HANDOVER_STEP, abs=1.5)


def test_a_worker_accepts_at_once_when_no_other_one_is_on_its_way_back(clock):
    last = LastAnswer()
    last.give_way(2)  # nobody has answered yet
    last.sending(2)
    last.give_way(2)  # its own answer
    last.sending(1)
    last.waiting(1)
    last.took(1)
    last.give_way(2)  # the other worker is busy with a request: a concurrent call
    last.sending(1)
    last.waiting(1)
    clock.now += GRACE
    last.give_way(2)  # the other worker has been waiting: the kernel chose this one
    last.sending(1)
    clock.now += HANDOVER
    last.give_way(2)  # the other worker answered too long ago (stuck closing)
    assert clock.sleeps == 0


def test_only_the_worker_that_answered_last_marks_itself_back_and_busy(clock):
    last = LastAnswer()
    last.sending(1)
    sent = clock.now
    last.waiting(2)
    last.took(1)  # not back yet
    assert last.read() == (1, sent, 0.0, 0.0)
    clock.now += 1
    last.waiting(1)
    last.took(2)
    assert last.read() == (1, 0.0, sent + 1, 0.0)
    clock.now += 1
    last.took(1)
    last.waiting(1)
    clock.now += 1
    last.took(1)  # only the first connection it takes since its return counts
    assert last.read() == (1, 0.0, sent + 1, sent + 2)


def test_the_last_answer_is_shared_with_forked_workers():
    last = LastAnswer()
    child = os.fork()
    if child == 0:
        last.sending(os.getpid())
        os._exit(0)
    os.waitpid(child, 0)
    assert last.read()[0] == child


@pytest.fixture
def connection():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
    with client, server:
        yield client, server


@pytest.fixture
def lingered(monkeypatch):
    closed = []
    monkeypatch.setattr(workers.util, "close_graceful", closed.append)
    return closed


def answer(server, *, whole: bool) -> DeadlineSocket:
    wrapped = DeadlineSocket(server, deadline=0.0, buffered=b"", whole=whole)
    wrapped.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
    return wrapped


def read_all(client) -> bytes:
    client.settimeout(5)
    data = b""
    while chunk := client.recv(65536):
        data += chunk
    return data


def test_a_whole_request_with_nothing_after_it_is_closed_at_once(connection, lingered):
    client, server = connection
    answer(server, whole=True).close_answered()
    assert lingered == []
    assert server.fileno() == -1
    assert read_all(client).endswith(b"\r\n\r\n{}")


def test_bytes_after_the_request_are_drained_by_a_lingering_close(connection, lingered):
    """Closing with unread bytes would reset the connection, which may cut the
    answer off before the client has read it."""
    client, server = connection
    client.sendall(b"GET /next HTTP/1.1\r\n")
    assert select.select([server], [], [], 5)[0]  # they have arrived
    wrapped = answer(server, whole=True)
    wrapped.close_answered()
    assert lingered == [wrapped]


def test_a_request_the_application_read_gets_a_lingering_close(connection, lingered):
    _, server = connection
    wrapped = answer(server, whole=False)
    wrapped.close_answered()
    assert lingered == [wrapped]


def queued(listener, count: int) -> bool:
    """Whether `count` connections wait on `listener` (within a second: the last
    handshake step is the kernel's)."""
    deadline = time.monotonic() + 1
    while workers.waiting_connections(listener) != count:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def test_the_accept_queue_is_counted_for_tcp_and_unknown_otherwise(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as listener:
        assert workers.waiting_connections(listener) == 0
        clients = [socket.create_connection(listener.getsockname()) for _ in range(3)]
        assert queued(listener, 3)
        accepted, _ = listener.accept()
        assert queued(listener, 2)
        for each in [accepted, *clients]:
            each.close()
    with socket.socket(socket.AF_UNIX) as unix:
        unix.bind(str(tmp_path / "listener.sock"))
        unix.listen()
        assert workers.waiting_connections(unix) == 1
