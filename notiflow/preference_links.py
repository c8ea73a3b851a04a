"""Links to a user's hosted preference page: a signed, expiring token naming the tenant and
the user, ``{base_url}/preferences/{token}``.

A token is a JWT (HS256, ``notiflow/signed_tokens.py``) with the tenant id, the tenant's own
user id (visible in the link: it is not secret, the signature is what grants access), when
it was issued and when it expires. It is the only credential of the page and its JSON twin,
so it is as good as the user's consent settings until it expires. The signing key is
derived from each correlation key, as the unsubscribe links' are, under another label.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from typing import Final

from pydantic import AwareDatetime

from notiflow.correlation import CorrelationKeyMissing, CorrelationKeys
from notiflow.schemas.messages import Wire
from notiflow.settings import Settings
from notiflow.signed_tokens import sign, verified_claims

AUDIENCE: Final = "notiflow-preferences"
_DERIVATION: Final = b"notiflow preference page v1"
LINK_VARIABLE: Final = "preferences_url"
"""The template variable a send to a user gets its preference page's link in."""


class InvalidLink(ValueError):
    """Not a link this platform issued, or one past its expiry."""


@dataclass(frozen=True, slots=True)
class PageGrant:
    """Whose preferences a link opens, and until when."""

    tenant_id: str
    user_id: str
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class PreferenceLinks:
    """The keys links are signed with (the first) and verified with (any)."""

    keys: tuple[bytes, ...]

    @classmethod
    def of(cls, correlation: CorrelationKeys) -> PreferenceLinks:
        return cls(correlation.derived(_DERIVATION))

    def issue(self, tenant_id: str, user_id: str, now: datetime,
              max_age: timedelta) -> tuple[str, PageGrant]:
        """A token for the user's page, valid for ``max_age`` from ``now``."""
        expires = datetime.fromtimestamp(int((now + max_age).timestamp()), UTC)
        claims = {"aud": AUDIENCE, "tid": tenant_id, "uid": user_id,
                  "iat": int(now.timestamp()), "exp": int(expires.timestamp())}
        return sign(claims, self.keys), PageGrant(tenant_id, user_id, expires)

    def verify(self, token: str, now: datetime) -> PageGrant:
        """Whose page ``token`` opens; :class:`InvalidLink` when no key signed it, a claim
        is missing or malformed, or it expired before ``now``."""
        claims = verified_claims(token, self.keys, AUDIENCE, ["exp", "tid", "uid"],
                                 InvalidLink)
        try:
            grant = PageGrant(str(claims["tid"]), str(claims["uid"]),
                              datetime.fromtimestamp(int(claims["exp"]), UTC))
        except (KeyError, ValueError, OverflowError, TypeError):
            raise InvalidLink("claims are not a page grant") from None
        if now >= grant.expires_at:
            raise InvalidLink("the link has expired")
        return grant


def page_url(base_url: str, token: str) -> str:
    return f"{base_url.rstrip('/')}/preferences/{token}"


class PageLink(Wire):
    """Body of ``POST /v1/users/{user_id}/preferences:link``."""

    url: str
    expires_at: AwareDatetime


def preference_link(settings: Settings, tenant_id: str, user_id: str,
                    now: datetime | None = None, keys: CorrelationKeys | None = None
                    ) -> PageLink | None:
    """A link to the user's preference page, the same all day (so a retried request
    carries the same link), valid for ``preference_page.max_age`` from the day's start;
    None when the deployment has no page (``preference_page.base_url`` unset). ``keys``:
    the settings' correlation keys, when the caller holds them already."""
    rule = settings.preference_page
    if rule.base_url is None:
        return None
    try:
        links = PreferenceLinks.of(keys or CorrelationKeys.from_settings(settings))
    except CorrelationKeyMissing:
        return None
    day = datetime.combine((now or datetime.now(UTC)).date(), time(0), UTC)
    token, grant = links.issue(tenant_id, user_id, day, rule.max_age)
    return PageLink(url=page_url(rule.base_url, token), expires_at=grant.expires_at)
