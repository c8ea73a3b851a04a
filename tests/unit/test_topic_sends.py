"""Topic sends through the campaign expander on in-memory ports: the subscribers snapshotted
once, each resolved to the user's channels (``deliver`` first and every), users who opted
out or have no address reported without their addresses, a crash resumed from the snapshot
(a subscriber added meanwhile is not in it), and the quota counting messages."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterable, AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from pydantic import SecretStr

from notiflow.adapters.campaign_store import CampaignRow, Progress
from notiflow.adapters.memory.stores import MemoryPreferences
from notiflow.adapters.memory.topics import MemoryTopics
from notiflow.adapters.memory.users import MemoryUsers
from notiflow.adapters.ports import TOPIC_BUCKETS
from notiflow.flows.campaigns.expander import Expander
from notiflow.flows.campaigns.members import People, snapshot_lines
from notiflow.redact import recipient_hashes, user_recipient_key
from notiflow.schemas.campaigns import parse_row_message_id, row_leg_message_id
from notiflow.schemas.enums import Category, Channel, Tier
from notiflow.schemas.messages import IngestRecord
from notiflow.schemas.preferences import OptOut, PreferenceState
from notiflow.schemas.topic_sends import TopicCampaign, TopicSendRequest, campaign_request
from notiflow.schemas.users import UserProfile, next_version
from notiflow.settings import IngestBinding, Settings, TenantConfig
from tests.unit.test_expander import CID, KEYS, NOW, Board, Signals, Sink

TENANT = "mkt"
SNAPSHOT = f"s3://notiflow/tenants/{TENANT}/topics/{CID}.jsonl"
IOS = "ios:" + "c" * 64


class Store:
    """Manifests whose writes are kept (the snapshot)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.writes = 0

    async def size(self, uri: str, tenant_id: str) -> int:
        return len(self.data[uri])

    async def chunks(self, uri: str, tenant_id: str, start: int,
                     size: int | None = None) -> AsyncIterator[bytes]:
        body = self.data[uri]
        for at in range(start, len(body), 500):
            yield body[at:at + 500]

    async def write(self, uri: str, tenant_id: str, data: AsyncIterable[bytes]) -> int:
        self.writes += 1
        self.data[uri] = b"".join([chunk async for chunk in data])
        return len(self.data[uri])


@dataclasses.dataclass
class World:
    users: MemoryUsers
    prefs: MemoryPreferences
    topics: MemoryTopics
    store: Store

    @classmethod
    def new(cls) -> World:
        return cls(MemoryUsers(lambda: NOW), MemoryPreferences(lambda: NOW), MemoryTopics(),
                   Store())

    def people(self) -> People:
        return People(self.users, self.prefs, self.topics, TOPIC_BUCKETS)

    async def user(self, user_id: str, **profile: Any) -> None:
        wanted = UserProfile.model_validate(profile)
        self.users.rows[(TENANT, user_id)] = next_version(None, wanted, user_id, NOW)

    def opt_out(self, user_id: str, channel: Channel | None = None,
                muted: tuple[str, ...] = ()) -> None:
        self.prefs.put(PreferenceState(
            tenant_id=TENANT, version=4, updated_at=NOW,
            recipient_hash=recipient_hashes(TENANT, user_recipient_key(user_id))[0],
            opt_outs=(OptOut(channel=channel, category=Category.MARKETING),) if channel
            else (), muted_topics=muted))


def settings() -> Settings:
    return Settings(ingest_binding=IngestBinding(keys=SecretStr("k" * 32)),
                    correlation_key=SecretStr(KEYS.keys[0].decode()),
                    tenants=(TenantConfig(id=TENANT, token=SecretStr("t" * 32)),)
                    ).model_copy(update={"campaigns": Settings().campaigns.model_copy(
                        update={"batch": 40})})


def topic_row(deliver: str = "first", quota: int = 10**9,
              channels: tuple[str, ...] = ("PUSH", "SMS")) -> CampaignRow:
    body = TopicSendRequest.model_validate({
        "channels": [{"channel": c, "template_id": c.lower(), "template_version": 1}
                     for c in channels],
        "deliver": deliver, "variables": {"version": "2.4"}})
    req = body.campaign("releases", SNAPSHOT)
    return CampaignRow(
        tenant_id=TENANT, campaign_id=CID, name=req.name, request=req, state="scheduled",
        reason=None, starts_at=NOW - timedelta(minutes=1), ends_at=NOW + timedelta(days=1),
        max_rate=1e6, quota=quota, created_at=NOW, updated_at=NOW, finished_at=None,
        progress=Progress(), lease_until=datetime(1970, 1, 1, tzinfo=UTC))


def expander(world: World, board: Board, sink: Sink, owner: str = "x1") -> Expander:
    return Expander(settings(), board, world.store, sink.publish, sink.hold, Signals(), owner,
                    clock=lambda: NOW, people=world.people())


async def run_one(x: Expander) -> str:
    assert await x.tick() == 1
    return await next(iter(x.tasks.values()))


def messages(sink: Sink) -> list[IngestRecord]:
    return [IngestRecord.model_validate_json(r.value) for r in sink.records]


async def audience(world: World, n: int) -> list[str]:
    """``n`` subscribers: every third has an iPhone and a phone, the others a phone."""
    ids = [f"u{i:04d}" for i in range(n)]
    for i, uid in enumerate(ids):
        await world.user(uid, phones=[f"+1415{3000000 + i}"],
                         devices=[{"platform": "ios", "token": IOS[4:-4] + f"{i:04d}"}]
                         if i % 3 == 0 else [], timezone="Europe/Paris", locale="fr")
    await world.topics.subscribe(TENANT, "releases", ids, NOW)
    return ids


async def test_each_subscriber_gets_the_first_channel_that_may_receive_it() -> None:
    world, sink = World.new(), Sink()
    ids = await audience(world, 120)
    world.opt_out("u0003", Channel.PUSH)
    await world.user("u0004")
    del world.users.rows[(TENANT, "u0005")]
    board = Board(topic_row())
    assert await run_one(expander(world, board, sink)) == "completed"
    assert world.store.writes == 1
    lines = world.store.data[SNAPSHOT].splitlines()
    assert sorted(orjson.loads(x)["user_id"] for x in lines) == ids
    sent = messages(sink)
    assert len(sent) == 118
    assert len({m.message_id for m in sent}) == 118
    by_row = {parse_row_message_id(KEYS, m.message_id or ""): m for m in sent}
    assert None not in by_row and {k[0] for k in by_row if k} == {CID}
    channels = {m.channel for m in sent}
    assert channels == {Channel.PUSH, Channel.SMS}
    assert sum(m.channel is Channel.PUSH for m in sent) == 39
    assert all(m.variables == {"version": "2.4"} and m.locale == "fr" and m.user is not None
               and m.user.timezone == "Europe/Paris" and m.tier is Tier.P3 for m in sent)
    assert sorted(board.errors.values()) == [
        "nothing_sent: push no_address, sms no_address",
        "unknown_user: no such user (erased since the snapshot)"]
    p = board.row.progress
    assert (p.rows_read, p.expanded, p.rejected) == (120, 118, 2)
    row_of = {uid: n for n, uid in enumerate(
        (orjson.loads(x)["user_id"] for x in lines), start=1)}
    opted = [m for m in sent if m.message_id == row_leg_message_id(
        KEYS, CID, row_of["u0003"], Channel.SMS, 0)]
    assert len(opted) == 1 and opted[0].channel is Channel.SMS


async def test_a_user_who_muted_the_topic_gets_nothing_from_it() -> None:
    world, sink = World.new(), Sink()
    await audience(world, 6)
    world.opt_out("u0001", muted=("deals", "releases"))
    world.opt_out("u0002", muted=("deals",))
    board = Board(topic_row())
    assert await run_one(expander(world, board, sink)) == "completed"
    assert len(sink.records) == 5
    assert list(board.errors.values()) == ["nothing_sent: push topic_muted, sms topic_muted"]


async def test_every_sends_one_message_per_channel_with_ids_of_the_row() -> None:
    world, sink = World.new(), Sink()
    await audience(world, 9)
    board = Board(topic_row(deliver="every"))
    assert await run_one(expander(world, board, sink)) == "completed"
    sent = messages(sink)
    assert len(sent) == 12
    rows = [parse_row_message_id(KEYS, m.message_id or "") for m in sent]
    assert sorted({r[1] for r in rows if r}) == list(range(1, 10))
    assert board.row.progress.expanded == 12


async def test_a_crash_resumes_from_the_snapshot_without_duplicates() -> None:
    world = World.new()
    ids = await audience(world, 200)
    board, crashed = Board(topic_row(channels=("SMS",))), Sink(fail_at=3)
    with pytest.raises(RuntimeError):
        await run_one(expander(world, board, crashed))
    assert board.row.progress.manifest_bytes == len(world.store.data[SNAPSHOT])
    await world.user("late", phones=["+14155550100"])
    await world.topics.subscribe(TENANT, "releases", ["late"], NOW)
    resumed = Sink()
    assert await run_one(expander(world, board, resumed, owner="x2")) == "completed"
    assert world.store.writes == 1
    before = {m.message_id for m in messages(crashed)}
    after = {m.message_id for m in messages(resumed)}
    assert not before & after
    assert {m.recipient for m in messages(crashed) + messages(resumed)} == {
        f"+1415{3000000 + i}" for i in range(len(ids))}


async def test_the_quota_counts_messages_and_ends_the_send() -> None:
    world, sink = World.new(), Sink()
    await audience(world, 30)
    board = Board(topic_row(deliver="every", quota=7))
    assert await run_one(expander(world, board, sink)) == "quota"
    assert len(sink.records) <= 7
    assert (board.row.state, board.row.reason) == ("completed", "quota")


async def test_snapshot_pages_through_every_bucket() -> None:
    topics = MemoryTopics()
    ids = [f"user-{i}" for i in range(2500)]
    await topics.subscribe(TENANT, "t", ids, NOW)
    data = b"".join([c async for c in snapshot_lines(topics, TENANT, "t", TOPIC_BUCKETS,
                                                     page=100)])
    assert sorted(orjson.loads(x)["user_id"] for x in data.splitlines()) == sorted(ids)


def test_stored_request_round_trips_as_a_topic_campaign() -> None:
    req = topic_row().request
    assert isinstance(req, TopicCampaign) and req.channel is Channel.PUSH
    again = campaign_request(req.model_dump_json())
    assert again == req and isinstance(again, TopicCampaign)
    sms = topic_row(channels=("SMS",)).request
    plain = campaign_request(sms.model_dump_json(exclude={"audience"}))
    assert not isinstance(plain, TopicCampaign) and plain.manifest == SNAPSHOT


def test_row_leg_ids_parse_to_their_row_and_stay_within_64() -> None:
    longest = row_leg_message_id(KEYS, CID, 99_999_999_999, Channel.INAPP, 15)
    assert len(longest) <= 64 and parse_row_message_id(KEYS, longest) == (
        CID, 99_999_999_999)
    assert parse_row_message_id(KEYS, longest.replace("if_", "sf_")) is None
    with pytest.raises(ValueError):
        row_leg_message_id(KEYS, CID, 1, Channel.PUSH, 16)
