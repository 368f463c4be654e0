"""One RabbitMQ broker for every broker test (it takes about 10 s to start)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.brokers.rabbitmq import Broker, missing, rabbitmq


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    why = missing()
    if why is not None:
        pytest.skip(why)
    with rabbitmq(tmp_path_factory.mktemp("rabbitmq")) as running:
        yield running
