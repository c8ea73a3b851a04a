"""Each tier's Redis calls (breakers, capacity limiter, leases) time out after the tier's
``redis_timeout``: fast for the priority lane, which falls back to local limits, and long
enough for the bulk lane's CPU-starved processes not to read a late event loop as an outage."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import SecretStr

from notiflow.adapters.breaker_lanes import BulkBreakers, lane_breakers
from notiflow.adapters.ratelimit import CapacityLimiter
from notiflow.adapters.redis_dedup import DedupStore
from notiflow.schemas.enums import Tier
from notiflow.settings import Settings, load_settings


def _socket_timeout(store: Any) -> float:
    return float(store.r.connection_pool.connection_kwargs["socket_timeout"])


@pytest.fixture
def settings() -> Settings:
    return load_settings().model_copy(update={"correlation_key": SecretStr("c" * 32)})


@pytest.mark.parametrize("tier", list(Tier))
def test_a_tiers_breakers_and_limiter_use_its_redis_timeout(settings: Settings,
                                                           tier: Tier) -> None:
    policy = settings.policy(tier)
    timeout = policy.redis_timeout.total_seconds()
    breakers = lane_breakers(settings, policy.lane, timeout)
    stores = ([breakers.own.store, breakers.priority.store] if isinstance(breakers, BulkBreakers)
              else [breakers.store])
    assert [_socket_timeout(s) for s in stores] == [timeout] * len(stores)
    assert _socket_timeout(CapacityLimiter(settings, store_timeout=timeout).store) == timeout
    assert _socket_timeout(DedupStore.open(settings, "o", timeout)) == timeout


def test_bulk_tiers_wait_longer_than_the_priority_lane(settings: Settings) -> None:
    """The priority lane notices a dead Redis or provider within its SLA; the bulk tiers'
    timeouts cover seconds without a core (their SLAs are minutes to an hour)."""
    p0, p3 = settings.policy(Tier.P0), settings.policy(Tier.P3)
    assert p0.redis_timeout <= timedelta(seconds=0.5) < p3.redis_timeout
    assert p0.provider_timeout < settings.policy(Tier.P2).provider_timeout < p3.provider_timeout
    assert p3.provider_timeout < p3.sla / 10
