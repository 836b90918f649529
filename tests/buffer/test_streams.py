"""The public facade exports what the generator worker and the learner loop import."""

from __future__ import annotations

from buffer import streams


def test_facade_exports_resolve() -> None:
    for name in streams.__all__:
        assert getattr(streams, name) is not None, name
    assert streams.RolloutProducer.push.__doc__ and streams.RolloutConsumer.take_batch.__doc__
