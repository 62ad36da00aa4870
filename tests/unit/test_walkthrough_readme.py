"""The README's deployment walk-through is ``examples/walkthrough.sh`` itself, which
``tests/e2e/test_walkthrough.py`` runs: the README's block after the ``<!--
examples/walkthrough.sh -->`` marker must be the script, byte for byte, so the two cannot
drift apart."""

from __future__ import annotations

from support.paths import ROOT

MARKER = "<!-- examples/walkthrough.sh -->\n```sh\n"


def test_the_readme_quotes_the_walkthrough_script_exactly() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    script = (ROOT / "examples" / "walkthrough.sh").read_text(encoding="utf-8")
    assert readme.count(MARKER) == 1, "README.md must quote examples/walkthrough.sh once"
    quoted = readme.split(MARKER, 1)[1].split("```\n", 1)[0]
    assert quoted == script


def test_the_script_stops_at_the_first_failure_and_cleans_up() -> None:
    script = (ROOT / "examples" / "walkthrough.sh").read_text(encoding="utf-8")
    assert script.startswith("#!/usr/bin/env bash\n")
    assert "\nset -euo pipefail\n" in script
    assert '\ntrap \'kill "${started[@]}"' in script
    assert (ROOT / "examples" / "walkthrough.sh").stat().st_mode & 0o111
