"""The benchmark workload (docs/design.md, "Time, retention and scale"): ~2 KB records,
push 60 % / email 30 % / SMS 10 %, unique recipients across countries and platforms.

Pure and deterministic for a seed: :func:`records` yields ``IngestRecord`` JSON bytes as an
upstream producer writes them (``message_id`` and ``accepted_at`` set by the producer, so
latency is measured from the moment the record was handed to Kafka). SMS recipients are drawn
from countries where it is daytime at ``now``: P2/P3 honour quiet hours (22:00-08:00 local),
and a drain measurement must not wait for a night to end. Every recipient is unique within a
run (recipient caps and content dedup would otherwise suppress the campaign).
"""

from __future__ import annotations

import hashlib
import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import orjson
import phonenumbers

from notiflow.providers.apns.emulator import MAGIC_TOKENS as APNS_MAGIC_TOKENS
from notiflow.schemas.enums import Category, Channel, PushPlatform, Tier
from notiflow.schemas.preferences import phone_timezone

CHANNEL_MIX: tuple[tuple[Channel, float], ...] = (
    (Channel.PUSH, 0.6), (Channel.EMAIL, 0.3), (Channel.SMS, 0.1))
RECORD_BYTES = 2048
"""Target size of one ingest record, metadata included (the design's 2 KB)."""
TEMPLATE_IDS = {c: f"bench-{c.value.lower()}" for c in Channel}

TEMPLATES: dict[Channel, dict[str, str]] = {
    Channel.SMS: {"body": "{{ brand }}: {{ headline }} {{ code }}"},
    Channel.EMAIL: {"subject": "{{ brand }}: {{ headline }}",
                    "body": "<p>Hello {{ first_name }},</p><p>{{ html }}</p>"},
    Channel.PUSH: {"subject": "{{ brand }}", "body": "{{ headline }} {{ teaser }}"},
}
"""One template per channel (``POST /v1/templates``, ids :data:`TEMPLATE_IDS`);
every record also carries campaign metadata variables the templates do not render, as real
campaign payloads do, to reach :data:`RECORD_BYTES`."""

REGIONS = ("US", "GB", "DE", "FR", "BR", "MX", "IN", "JP", "AU", "ZA", "AE", "SG", "CA", "ES")
"""Countries the SMS recipients come from (their example mobile numbers seed the ranges; the
ones at night when the run starts are skipped)."""

TENANT_BY_TIER = {Tier.P0: "acme", Tier.P1: "acme", Tier.P2: "globex", Tier.P3: "mkt"}
CATEGORY_BY_TIER = {Tier.P0: Category.OTP, Tier.P1: Category.TRANSACTIONAL,
                    Tier.P2: Category.ACCOUNT, Tier.P3: Category.MARKETING}


def awake(number: str, now: datetime) -> bool:
    """Whether the send flow would send to ``number`` now: its zone (the flow's rule) is
    between 09:00 and 21:00, or the number has no single zone (no quiet hours apply)."""
    zone = phone_timezone(number)
    return zone is None or 9 <= now.astimezone(ZoneInfo(zone)).hour < 21


@dataclass
class PhoneFactory:
    """Unique valid mobile numbers: each region's example mobile number with its last digits
    replaced by a counter; invalid numbers and numbers at night at ``now`` are skipped."""

    regions: tuple[str, ...]
    now: datetime
    start: int = 0
    """First serial (two factories with far-apart starts never meet)."""

    def __post_init__(self) -> None:
        self._bases = []
        for region in self.regions:
            ex = phonenumbers.example_number_for_type(region,
                                                      phonenumbers.PhoneNumberType.MOBILE)
            if ex is not None:
                self._bases.append(phonenumbers.format_number(
                    ex, phonenumbers.PhoneNumberFormat.E164))
        if not self._bases:
            raise ValueError("no region with a mobile numbering plan")
        self._next = self.start * len(self._bases)

    def take(self) -> str:
        for _ in range(1000):
            i = self._next
            self._next += 1
            base = self._bases[i % len(self._bases)]
            serial = f"{i // len(self._bases):06d}"
            candidate = base[:-6] + serial
            if (phonenumbers.is_valid_number(phonenumbers.parse(candidate, None))
                    and awake(candidate, self.now)):
                return candidate
        raise RuntimeError("ran out of valid numbers")


def pick_channel(rng: random.Random) -> Channel:
    x = rng.random()
    for channel, share in CHANNEL_MIX:
        if x < share:
            return channel
        x -= share
    return CHANNEL_MIX[-1][0]


def _filler(rng: random.Random, n: int) -> str:
    words = ("spring", "offer", "members", "save", "today", "new", "arrivals", "free",
             "delivery", "limited", "collection", "exclusive", "early", "access", "ends")
    out: list[str] = []
    size = 0
    while size < n:
        w = rng.choice(words)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)[:n]


@dataclass(frozen=True, slots=True)
class Generated:
    message_id: str
    channel: Channel
    value: bytes


@dataclass
class Workload:
    """Records for one run: ``run_id`` makes message ids, emails and tokens unique per run."""

    run_id: str
    seed: int = 7
    now: datetime | None = None
    phone_start: int = 0
    """First phone serial: workloads of one run need far-apart starts, or their SMS
    recipients meet and the marketing frequency cap suppresses the later one's."""

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        now = self.now or datetime.now(UTC)
        self.phones = PhoneFactory(REGIONS, now, start=self.phone_start)
        self.counter = 0

    @property
    def prefix(self) -> str:
        """Every message id of this workload starts with it."""
        return f"msg_bench_{self.run_id}_"

    def recipient(self, channel: Channel) -> tuple[str | dict[str, str], str]:
        """A unique recipient of ``channel`` and its kind (sms, email, ios, android, web)."""
        i = self.counter
        self.counter += 1
        if channel is Channel.SMS:
            return self.phones.take(), "sms"
        if channel is Channel.EMAIL:
            domain = ("example.com", "example.org", "example.net")[i % 3]
            return f"user.{self.run_id}.{i}@{domain}", "email"
        platform = (PushPlatform.IOS, PushPlatform.ANDROID, PushPlatform.ANDROID,
                    PushPlatform.WEB)[i % 4]
        digest = hashlib.sha256(f"{self.run_id}:{i}".encode()).hexdigest()
        while digest.startswith(tuple(APNS_MAGIC_TOKENS)):
            digest = hashlib.sha256(digest.encode()).hexdigest()
        token = digest * 2 if platform is PushPlatform.IOS else f"{platform.value}:{digest}"
        return {"device_token": token, "platform": platform.value}, platform.value

    def record(self, tier: Tier, channel: Channel | None = None, *,
               versions: dict[tuple[str, Channel], int] | None = None,
               accepted_at: datetime | None = None) -> Generated:
        """One message of ``tier``; ``versions``: (tenant, channel) → template version
        (default 1)."""
        channel = channel or pick_channel(self.rng)
        recipient, _kind = self.recipient(channel)
        message_id = f"{self.prefix}{self.counter}_{uuid.uuid4().hex[:8]}"
        variables: dict[str, str | int] = {
            "brand": "Notiflow", "headline": _filler(self.rng, 60), "code":
            f"{self.rng.randrange(10**6):06d}", "first_name": "Alex",
            "teaser": _filler(self.rng, 80), "html": _filler(self.rng, 400),
            "campaign_id": f"cmp_{self.run_id}", "segment": "returning-customers",
        }
        doc: dict[str, object] = {
            "schema_version": 1, "tenant_id": TENANT_BY_TIER[tier],
            "message_id": message_id, "channel": channel.value, "tier": tier.value,
            "category": CATEGORY_BY_TIER[tier].value, "recipient": recipient,
            "template_id": TEMPLATE_IDS[channel],
            "template_version": (versions or {}).get((TENANT_BY_TIER[tier], channel), 1),
            "variables": variables,
            "accepted_at": (accepted_at or datetime.now(UTC)).isoformat(),
        }
        size = len(orjson.dumps(doc))
        if size < RECORD_BYTES:
            variables["tracking"] = _filler(self.rng, RECORD_BYTES - size - 16)
        return Generated(message_id, channel, orjson.dumps(doc))


def records(workload: Workload, tier: Tier, n: int,
            versions: dict[tuple[str, Channel], int] | None = None) -> Iterator[Generated]:
    """``n`` records of ``tier`` in the channel mix."""
    for _ in range(n):
        yield workload.record(tier, versions=versions)
