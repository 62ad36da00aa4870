"""Names and labels refuse control and format characters, on SQLite and PostgreSQL alike (issue
29, item 6).

An agent named ``"Bank\u202eA"`` displays as another name (U+202E, RIGHT-TO-LEFT OVERRIDE), and
invisible characters (zero-width spaces, controls) make two names that look equal differ. Every
name and label the store keeps (an agent's name and labels, an enrolment token's labels, a
certificate's common name, an actor, a job's name) refuses the Unicode categories Cc and Cf with
an ``InvalidInput`` naming the field and the code point; a reason (free text) refuses them too,
but for tab and line feed. Nothing is written.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from support.databases import PostgresBackend, SqliteBackend

from dpfl.learning.jobs import parse_job
from dpfl.server.errors import InvalidInput
from dpfl.server.store import AgentStatus, Store

#: (character, how the refusal shows it): overrides, isolates, invisible and control characters
REFUSED = [
    ("\u202e", "U+202E RIGHT-TO-LEFT OVERRIDE"),
    ("\u2066", "U+2066 LEFT-TO-RIGHT ISOLATE"),
    ("\u200b", "U+200B ZERO WIDTH SPACE"),
    ("\ufeff", "U+FEFF ZERO WIDTH NO-BREAK SPACE"),
    ("\x07", "U+0007"),
    ("\x1b", "U+001B ESCAPE"),
    ("\n", "U+000A LINE FEED"),
    ("\x85", "U+0085"),
]


def _refused(call: Callable[[], Any], field: str, shown: str) -> None:
    expected = f"^{re.escape(field)}: character {re.escape(shown)} at position 3 is not allowed"
    with pytest.raises(InvalidInput, match=expected):
        call()


class NamesContract:
    @pytest.mark.parametrize(("char", "shown"), REFUSED)
    def test_every_name_and_label_refuses_controls_and_format_characters(
        self, store: Store, char: str, shown: str
    ) -> None:
        agent = store.create_agent(name="ok")
        token = store.create_enrollment_token(ttl=timedelta(hours=1)).token
        tokens_before = store.list_enrollment_tokens()
        bad = f"Ban{char}k"
        _refused(lambda: store.create_agent(name=bad), "name", shown)
        _refused(lambda: store.create_agent(name="x", labels={"site": bad}), "label 'site'", shown)
        _refused(
            lambda: store.create_enrollment_token(ttl=timedelta(hours=1), labels={"site": bad}),
            "token label 'site'",
            shown,
        )
        _refused(lambda: store.redeem_enrollment_token(token, name=bad), "name", shown)
        _refused(
            lambda: store.redeem_enrollment_token(token, name="x", labels={"site": bad}),
            "label 'site'",
            shown,
        )
        _refused(
            lambda: store.redeem_enrollment_token(token, name="x", certificate_cn=bad),
            "certificate common name",
            shown,
        )
        _refused(
            lambda: store.set_agent_status(agent.id, AgentStatus.DISABLED, actor=bad),
            "actor",
            shown,
        )
        if char not in "\n":  # a reason may span lines
            _refused(
                lambda: store.set_agent_status(
                    agent.id, AgentStatus.DISABLED, actor="admin", reason=bad
                ),
                "reason",
                shown,
            )
        assert [a.id for a in store.list_agents()] == [agent.id]
        assert store.get_agent(agent.id).status == AgentStatus.ACTIVE
        assert store.list_enrollment_tokens() == tokens_before
        assert store.audit_records() == []

    def test_a_job_name_with_a_trailing_newline_is_refused(self, store: Store) -> None:
        # the job document's own pattern ends in "$", which also matches before a final "\n"
        spec = parse_job(
            {"name": "demo\n", "algorithm": "dp-fedavg", "privacy": {"target_epsilon": 4.0}}
        )
        with pytest.raises(InvalidInput, match=r"^job name: character U\+000A LINE FEED"):
            store.create_job(spec)
        assert store.list_jobs() == []

    def test_what_a_name_may_hold(self, store: Store) -> None:
        names = ["Hôpital Saint-Louis", "病院 A", "مستشفى", "Bank B (eu-west)", "👩‍⚕️ clinic"]
        # U+200D ZERO WIDTH JOINER (in the emoji) is Cf: refused like any format character
        for name in names[:-1]:
            assert store.create_agent(name=name, labels={"site": name}).name == name
        with pytest.raises(InvalidInput, match="U\\+200D ZERO WIDTH JOINER"):
            store.create_agent(name=names[-1])
        agent = store.list_agents()[0]
        changed = store.set_agent_status(
            agent.id, AgentStatus.DISABLED, actor="admin", reason="lost laptop\n\tticket 42"
        )
        assert changed.status == AgentStatus.DISABLED
        assert store.audit_records()[-1].detail.endswith("reason: lost laptop\n\tticket 42")


class TestSqlite(SqliteBackend, NamesContract):
    pass


class TestPostgres(PostgresBackend, NamesContract):
    pass
