"""Campaign rows pass the API's recipient checks: a chat URL no enabled provider posts to, or
an in-app row of a tenant whose users cannot open their inbox, is a rejected row with the
API's reason (never quoting the row), charged to the campaign's tenant; the API answers 422
with the same codes."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from notiflow.flows.campaigns.expander import Expander, served_row
from notiflow.flows.campaigns.manifest import Mapped, Rejected
from notiflow.gateway.checks import check_recipient
from notiflow.gateway.errors import ApiError
from notiflow.recipient_checks import recipient_problem
from notiflow.schemas.enums import Channel, Tier
from notiflow.schemas.messages import IngestRecord
from notiflow.settings import IngestBinding, Settings, TenantConfig
from tests.unit.test_expander import KEYS, NOW, Board, Manifests, Signals, Sink, request, row

SLACK = "https://hooks.slack.com/services/T000/B000/XXXXXXXX"
TEAMS = "https://acme.logic.azure.com/workflows/abc/triggers/manual/paths/invoke"
FOREIGN = "https://hooks.evil.example/services/T000/B000/XXXXXXXX"
KEY = "k" * 32


def settings(*, inbox: bool) -> Settings:
    tenant = TenantConfig(id="mkt", inbox_keys=(KEY,) if inbox else ())
    base = Settings(ingest_binding=IngestBinding(keys=SecretStr(KEY)),
                    correlation_key=SecretStr(KEYS.keys[0].decode()))
    return base.model_copy(update={
        "tenants": (tenant,),
        "campaigns": base.campaigns.model_copy(update={"batch": 50})})


def chat_manifest(urls: list[str]) -> bytes:
    return ("url,name\n" + "".join(f"{u},User {i}\n" for i, u in enumerate(urls))).encode()


def inapp_manifest(n: int) -> bytes:
    return ("user,name\n" + "".join(f"inapp:u{i},User {i}\n" for i in range(n))).encode()


async def expand(s: Settings, channel: str, column: str, data: bytes) -> tuple[Board, Sink]:
    req = request(channel=channel, tier=Tier.P3.value,
                  mapping={"recipient": column, "variables": {"name": "name"}})
    board, sink = Board(row(req)), Sink()
    x = Expander(s, board, Manifests(data), sink.publish, sink.hold, Signals(), "x1",
                 clock=lambda: NOW)
    assert await x.tick() == 1
    assert await next(iter(x.tasks.values())) == "completed"
    return board, sink


async def test_a_chat_row_no_provider_serves_is_rejected_like_the_api_would() -> None:
    board, sink = await expand(settings(inbox=False), "CHAT", "url",
                               chat_manifest([SLACK, FOREIGN, TEAMS, FOREIGN]))
    assert sink.rows() == [1, 3]
    assert sorted(board.errors) == [2, 4]
    for reason in board.errors.values():
        assert reason.startswith("recipient_not_served: ")
        assert "evil" not in reason
    assert board.row.progress.rejected == 2


@pytest.mark.parametrize(("inbox", "expanded"), [(False, []), (True, [1, 2, 3])])
async def test_inapp_rows_need_a_tenant_whose_users_can_open_their_inbox(
        inbox: bool, expanded: list[int]) -> None:
    board, sink = await expand(settings(inbox=inbox), "INAPP", "user", inapp_manifest(3))
    assert sink.rows() == expanded
    assert all(r.startswith("inbox_not_configured: ") for r in board.errors.values())
    assert len(board.errors) == 3 - len(expanded)


def mapped(channel: Channel, recipient: str) -> Mapped:
    record = IngestRecord.model_validate({
        "channel": channel, "tier": "P3", "recipient": recipient, "template_id": "promo",
        "template_version": 1, "tenant_id": "mkt", "message_id": "m1",
        "accepted_at": NOW.isoformat()})
    return Mapped(7, record, NOW)


def test_served_row_passes_rows_it_cannot_judge() -> None:
    s = settings(inbox=False)
    tenant = s.tenant("mkt")
    bad = Rejected(3, "empty recipient")
    assert served_row(s, tenant, bad) is bad
    unserved = mapped(Channel.CHAT, FOREIGN)
    assert served_row(s, None, unserved) is unserved
    assert served_row(s, tenant, mapped(Channel.CHAT, SLACK)).row == 7
    out = served_row(s, tenant, unserved)
    assert isinstance(out, Rejected) and out.row == 7


@pytest.mark.parametrize(("channel", "recipient", "inbox", "code"), [
    (Channel.CHAT, FOREIGN, True, "recipient_not_served"),
    (Channel.CHAT, SLACK, True, None),
    (Channel.INAPP, "inapp:u1", False, "inbox_not_configured"),
    (Channel.INAPP, "inapp:u1", True, None),
    (Channel.SMS, "+14155552671", False, None),
])
def test_the_api_and_the_expander_share_one_check(channel: Channel, recipient: str,
                                                  inbox: bool, code: str | None) -> None:
    s = settings(inbox=inbox)
    tenant = s.tenant("mkt")
    assert tenant is not None
    problem = recipient_problem(s, tenant, channel, recipient)
    assert (problem.code if problem else None) == code
    if code is None:
        check_recipient(s, tenant, channel, recipient)
        return
    with pytest.raises(ApiError) as err:
        check_recipient(s, tenant, channel, recipient)
    assert (err.value.status, err.value.reason) == (422, code)
