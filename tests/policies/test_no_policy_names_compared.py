"""A policy's behaviour lives in its object: outside the tables that map wire names to
objects (dataplane/policies/) or to facts (rimuru/policy/tunables.py's _MODE_FACTS), no
code compares a memory-policy name. The facts agree with the objects."""

import re
from pathlib import Path

import pytest

from rimuru.dataplane.policies import policy_named
from rimuru.policy import ELASTIC_RULES, MODES, Tunables, mode_facts

ROOT = Path(__file__).parents[2]
NAME_COMPARED = re.compile(r"""(==|!=|\bin)\s*\(?\s*["'](resident|fixed|elastic|cost|paper)["']""")


@pytest.mark.parametrize("folder", ["dataplane", "rimuru", "operator", "controlplane"])
def test_no_code_compares_a_policy_name(folder):
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path.parent != ROOT / "dataplane" / "policies"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if NAME_COMPARED.search(line)
    ]
    assert found == []


def test_the_pattern_finds_a_comparison():
    assert NAME_COMPARED.search('if t.mode != "resident":')
    assert NAME_COMPARED.search("rule in ('cost', 'paper')")
    assert not NAME_COMPARED.search('"resident": ModeFacts(offloads=False)')


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("rule", ELASTIC_RULES)
def test_the_leafs_facts_agree_with_the_policy_objects(mode, rule):
    facts, policy = mode_facts(mode), policy_named(mode, rule)
    assert (facts.offloads, facts.moves_boundary) == (policy.offloads, policy.moves_boundary)
    # The rule matters only where the mode has one (elastic): tpot_slo_ms follows it.
    assert (rule in facts.priced_rules) == policy.prices_copies
    slo_taken = True
    try:
        Tunables(mode=mode, elastic_rule=rule, tpot_slo_ms=50.0)
    except ValueError:
        slo_taken = False
    assert slo_taken == policy.prices_copies
