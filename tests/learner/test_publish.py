"""A resumed learner redoing published steps must not move the version registry backwards."""

from __future__ import annotations

from buffer.streams import VersionRegistry
from learner.runtime.published import publish_unless_done


def test_republishing_an_older_version_is_skipped(redis_server) -> None:
    versions = VersionRegistry(redis_server.client(), "resume-run")
    publish_unless_done(versions, 0, "/store/v000000")
    versions.publish(4, "/store/v000004")  # the killed run got this far before dying
    publish_unless_done(versions, 3, "/store/v000003")  # the resumed run redoes step 3
    assert versions.current() == (4, "/store/v000004")
    publish_unless_done(versions, 5, "/store/v000005")
    assert versions.current() == (5, "/store/v000005")
