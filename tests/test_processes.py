"""The check of tests/processes.py can fail: a test that starts a server or a process
without the marker that says so is noted (and would fail), one with it is not."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from tests import processes


def test_a_server_started_without_its_marker_is_noted(request: pytest.FixtureRequest) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
    # Taken back, so this test itself passes: the note is what would have failed it.
    noted = processes._started.pop(request.node.nodeid)
    assert len(noted) == 1 and noted[0].startswith("a server listening on ('127.0.0.1'")


def test_a_process_started_without_its_marker_is_noted(request: pytest.FixtureRequest) -> None:
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    noted = processes._started.pop(request.node.nodeid)
    assert len(noted) == 1 and noted[0].startswith("a process:")


@pytest.mark.process
def test_a_marked_test_may_start_one(request: pytest.FixtureRequest) -> None:
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    assert request.node.nodeid not in processes._started


def test_e2e_and_worker_imply_process_and_a_server_fixture_marks_its_test(pytestconfig: pytest.Config) -> None:
    class Item:
        def __init__(self, markers: list[str], fixturenames: list[str], nodeid: str = "tests/x.py::t") -> None:
            self.nodeid = nodeid
            self.markers = [getattr(pytest.mark, m) for m in markers]
            self.fixturenames = fixturenames

        def get_closest_marker(self, name: str) -> object:
            return next((m for m in self.markers if m.name == name), None)

        def add_marker(self, name: str) -> None:
            self.markers.append(getattr(pytest.mark, name))

    items = [
        Item(["e2e"], []),
        Item(["worker"], []),
        Item([], ["receiver"]),
        Item([], ["db"], "tests/test_types.py::test_mypy_strict_passes_over_the_engine_and_the_runs_package"),
        Item([], ["db"]),
    ]
    processes.pytest_collection_modifyitems(items)  # type: ignore[arg-type]
    assert [bool(i.get_closest_marker("process")) for i in items] == [True, True, True, True, False]
