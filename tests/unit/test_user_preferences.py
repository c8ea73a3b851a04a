"""A user's own preferences: no one opts out of a required category (a sign-in code, a
security alert), while a suppression of the address still stops it; and the send flow's
strong-consent stage reads the preferences of the user a message was sent to (memory
ports) before it sends."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from notiflow.flows.send.stages.gates import StrongConsent
from notiflow.flows.send.stages.send_batch import Batch, attempt_key
from notiflow.redact import user_hash
from notiflow.schemas.enums import Category, Channel, Status
from notiflow.schemas.messages import StatusEvent
from notiflow.schemas.preferences import (
    REQUIRED_CATEGORIES,
    OptOut,
    PreferenceState,
    PreferencesUpdate,
    UserPreferencesUpdate,
)
from tests.unit.memory_send import T0, run, setup, work


@pytest.mark.parametrize("category", sorted(Category))
def test_an_opt_out_never_blocks_a_required_category(category: Category) -> None:
    state = PreferenceState(tenant_id="acme", recipient_hash="h", version=1, updated_at=T0,
                            opt_outs=(OptOut(), OptOut(channel=Channel.SMS,
                                                       category=category)))
    blocked = state.blocks(Channel.SMS, category)
    assert blocked == (None if category in REQUIRED_CATEGORIES else "opted_out")
    dead = state.model_copy(update={"suppressed": "unsubscribed"})
    assert dead.blocks(Channel.SMS, category) == "unsubscribed"


@pytest.mark.parametrize("model", [PreferencesUpdate, UserPreferencesUpdate])
def test_no_one_may_ask_to_opt_out_of_otp_or_security(model: type) -> None:
    for category in ("otp", "security"):
        with pytest.raises(ValidationError):
            model.model_validate({"opt_outs": [{"channel": "SMS", "category": category}]})
    ok = model.model_validate({"opt_outs": [{"channel": "*", "category": "marketing"},
                                            {"category": "*"}]})
    assert [o.category for o in ok.opt_outs] == ["marketing", "*"]


def users_state(opt_outs: tuple[OptOut, ...]) -> PreferenceState:
    return PreferenceState(tenant_id="acme", recipient_hash=user_hash("acme", "ana"),
                           version=3, updated_at=T0, opt_outs=opt_outs)


def test_the_send_flow_honours_the_users_own_opt_out_before_it_sends() -> None:
    s = setup()
    s.state.put_preference(users_state((OptOut(channel=Channel.SMS,
                                               category=Category.TRANSACTIONAL),)))
    stamp = {"user_hash": user_hash("acme", "ana"), "timezone": None}
    to_ana = work(s, 1, category="transactional", user=stamp)
    code_to_ana = work(s, 2, category="otp", user=stamp)
    to_address = work(s, 3, category="transactional")
    to_ana_by_mail_category = work(s, 4, category="account", user=stamp)
    batch = Batch([to_ana, code_to_ana, to_address, to_ana_by_mail_category], T0)
    run(StrongConsent()(batch, s.ctx))
    [suppressed] = [e for e in batch.decided[attempt_key(to_ana)]
                    if isinstance(e, StatusEvent)]
    assert (suppressed.status, suppressed.reason) == (Status.SUPPRESSED, "opted_out")
    assert set(batch.decided) == {attempt_key(to_ana)}
