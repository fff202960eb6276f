"""Two RimuruDeployments in one namespace never share a child: whatever their names, no
child of one has the kind and name of a child of the other."""

from __future__ import annotations

from rimuru.operator.naming import child_refs, config_map_name
from rimuru.operator.spec import Owner


def _refs(name: str) -> set[tuple[str, str]]:
    owner = Owner(name, "default", f"uid-{name}", 1)
    return {*child_refs(owner), ("ConfigMap", config_map_name(owner, "0123456789abcdef"))}


def test_no_child_name_of_one_deployment_is_a_child_name_of_another():
    # Two names can only give the same child name when one is the other plus the start of
    # a child's suffix ("x" and "x-dataplane" for x-dataplane-token): try every such name.
    base = "x"
    for _, child in _refs(base):
        suffix = child.removeprefix(base)
        for cut in range(1, len(suffix)):
            other = base + suffix[:cut]
            assert not _refs(base) & _refs(other), (base, other)


def test_the_clash_that_was_reported_is_gone():
    assert ("Secret", "x-dataplane-token") in _refs("x")
    assert ("Secret", "x-dataplane-token") not in _refs("x-dataplane")
