"""docs/utility.md's Python API example, run as written (issue 36, item 6): it learns (the old
10-agent setting stayed at chance), and ``result.to_json()`` is the JSON line its name says
(``to_dict()`` the same document as a dict)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from support.paths import ROOT

pytestmark = pytest.mark.slow

UTILITY = ROOT / "docs" / "utility.md"


def example() -> str:
    """The first Python block under "## Python API"."""
    text = UTILITY.read_text(encoding="utf-8")
    section = text[text.index("## Python API") :]
    match = re.search(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert match is not None, "docs/utility.md#python-api lost its example"
    return match.group(1)


def test_the_python_api_example_learns_and_to_json_is_a_json_line() -> None:
    namespace: dict[str, Any] = {}
    exec(compile(example(), str(UTILITY), "exec"), namespace)  # the documented lines, unchanged
    result = namespace["result"]
    assert result.status == "completed", result.error
    assert result.stop is None
    assert result.accuracy >= 0.7, f"the documented example reaches only {result.accuracy:.3f}"
    assert max(result.epsilon.values()) <= 4.0
    line = result.to_json()
    assert isinstance(line, str)
    assert "\n" not in line
    assert json.loads(line) == json.loads(json.dumps(result.to_dict()))
    assert json.loads(line)["accuracy"] == result.accuracy
