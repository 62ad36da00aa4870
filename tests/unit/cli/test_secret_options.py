"""A secret passed as the next argument is taken whole, even when it starts with "-"."""

from __future__ import annotations


def test_a_secret_option_takes_the_next_argument_even_with_a_dash() -> None:
    from dpfl.cmdline import glued

    assert glued(["budget", "--token", "-abc", "--json"]) == ["budget", "--token=-abc", "--json"]
    assert glued(["--token=x", "--token"]) == ["--token=x", "--token"]  # argparse names the gap
    assert glued(["run", "--", "--token", "-x"]) == ["run", "--", "--token", "-x"]
