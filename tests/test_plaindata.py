"""Pickles of plain data (nkibuild/plaindata.py): read without running code, and
without the garbage collector scanning what is being loaded."""

from __future__ import annotations

import gc
import pickle
from collections.abc import Iterator

import pytest

from nkibuild import plaindata


class Noted:
    """A record class a file may name: notes whether collections could run as it loads."""

    collector_on: list[bool] = []  # noqa: RUF012  # per test, cleared by the fixture

    def __init__(self) -> None:
        self.value = 1  # some state: pickle sets it through __setstate__

    def __setstate__(self, state: dict) -> None:
        Noted.collector_on.append(gc.isenabled())
        self.__dict__.update(state)


@pytest.fixture
def noted() -> Iterator[list[bool]]:
    Noted.collector_on = []
    was = gc.isenabled()
    yield Noted.collector_on
    if was:
        gc.enable()


def test_no_collection_runs_while_loading_and_the_collector_resumes(noted: list[bool]) -> None:
    data = pickle.dumps([Noted(), {"a": [1, 2]}], protocol=plaindata.PROTOCOL)
    assert gc.isenabled()
    loaded = plaindata.loads(data, classes=[Noted])
    assert noted == [False] and gc.isenabled()
    assert loaded[1] == {"a": [1, 2]}


def test_a_collector_already_off_is_left_off(noted: list[bool]) -> None:
    data = pickle.dumps(Noted(), protocol=plaindata.PROTOCOL)
    gc.disable()
    plaindata.loads(data, classes=[Noted])
    assert noted == [False] and not gc.isenabled()


def test_a_damaged_pickle_is_refused_and_the_collector_resumes() -> None:
    with pytest.raises(ValueError, match="not a pickle of plain data"):
        plaindata.loads(pickle.dumps([1, 2])[:-3])
    with pytest.raises(ValueError, match="named in a file of plain data"):
        plaindata.loads(pickle.dumps(Noted()))
    assert gc.isenabled()
