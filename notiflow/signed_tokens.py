"""HS256 JWTs signed with the first of a list of keys and verified under any of them (key
rotation): the links in messages (unsubscribe, the preference page) use them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import jwt

ALGORITHM: Final = "HS256"


def sign(claims: dict[str, Any], keys: Sequence[bytes]) -> str:
    return jwt.encode(claims, keys[0], algorithm=ALGORITHM)


def verified_claims(token: str, keys: Sequence[bytes], audience: str,
                    required: Sequence[str], error: type[ValueError]) -> dict[str, Any]:
    """The claims of ``token`` under the first key that verifies it, its audience and the
    ``required`` claims present (an ``exp`` is checked by the caller); ``error`` when no
    key verifies it or it is malformed."""
    for key in keys:
        try:
            return dict(jwt.decode(token, key, algorithms=[ALGORITHM], audience=audience,
                                   options={"require": ["aud", *required],
                                            "verify_exp": False}))
        except jwt.InvalidSignatureError:
            continue
        except jwt.PyJWTError as exc:
            raise error(str(exc)) from None
    raise error("signature not valid under any key")
