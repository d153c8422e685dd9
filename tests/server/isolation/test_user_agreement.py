"""Team users agree across machines: ids derived from the name alone, a node creates the
server's user with exactly its ids, and a node whose user table disagrees is refused."""

from __future__ import annotations

import os
import pwd

import pytest

from gpupool.errors import SpecError
from gpupool.ports.executor.base import JobUser
from gpupool.server.isolation.containment import (
    DERIVED_ID_BASE,
    DERIVED_ID_SPAN,
    FakeUsers,
    SystemUsers,
    agree_user,
    derived_id,
)


def test_derived_ids_depend_on_the_name_only() -> None:
    assert derived_id("gpupool-research") == derived_id("gpupool-research")
    assert derived_id("gpupool-research") != derived_id("gpupool-vision")
    ids = {derived_id(f"gpupool-team{k}") for k in range(200)}
    assert all(DERIVED_ID_BASE <= i < DERIVED_ID_BASE + DERIVED_ID_SPAN for i in ids)
    assert len(ids) == 200


def test_a_node_creates_the_servers_user_with_its_ids() -> None:
    node = FakeUsers()
    agree_user(JobUser("gpupool-a", 3_000_123, 3_000_123), "n1", node)
    assert node.lookup("gpupool-a") == JobUser("gpupool-a", 3_000_123, 3_000_123)
    agree_user(JobUser("gpupool-a", 3_000_123, 3_000_123), "n1", node)  # agrees: no change
    assert node.created == ["gpupool-a"]


def test_a_node_whose_user_table_disagrees_is_refused_with_the_reason() -> None:
    node = FakeUsers({"gpupool-a": 1001})
    with pytest.raises(SpecError, match=r"node n2's user table disagrees.*uid 1001.*3000123"):
        agree_user(JobUser("gpupool-a", 3_000_123, 3_000_123), "n2", node)


@pytest.mark.skipif(os.geteuid() != 0, reason="creating a Unix user needs root")
def test_a_real_user_is_created_with_the_derived_ids() -> None:
    name = "gpupool-agree-t"
    users = SystemUsers()
    try:
        made = users.lookup(name) or users.create(name)
        assert (made.uid, made.gid) == (derived_id(name), derived_id(name))
        assert pwd.getpwnam(name).pw_uid == derived_id(name)
        agree_user(made, "here", users)
        with pytest.raises(SpecError, match="disagrees"):
            agree_user(JobUser(name, made.uid + 1, made.gid), "here", users)
    finally:
        os.system(f"userdel {name} >/dev/null 2>&1; groupdel {name} >/dev/null 2>&1")
