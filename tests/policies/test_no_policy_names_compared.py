"""A policy's behaviour lives in its object: outside the one table that maps wire names to
objects, the data plane compares no memory-policy name."""

import re
from pathlib import Path

ROOT = Path(__file__).parents[2]
NAME_COMPARED = re.compile(r"""(==|!=|\bin)\s*\(?\s*["'](resident|fixed|elastic|cost|paper)["']""")


def test_the_data_plane_compares_no_policy_name():
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in sorted((ROOT / "dataplane").rglob("*.py"))
        if path.parent.name != "policies"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if NAME_COMPARED.search(line)
    ]
    assert found == []
