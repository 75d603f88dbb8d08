"""Secrets out of anything a person or a log reads: the password of a Redis
URL (``user:password@``, ``?password=``, ``?sentinel_password=``) becomes ``***``."""

from __future__ import annotations

import re

# scheme://userinfo@ (userinfo up to the last @ before the host part)
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^\s/?#]*@")
# host:port forms without a scheme, as the reference's redis_addr allows
_BARE_USERINFO = re.compile(r"^[^\s/:@]*:[^\s/@]*@(?=[^\s@]+$)")
_QUERY = re.compile(r"(?i)(?P<name>[?&](?:\w*password|pass|pwd|auth|token)=)[^&#\s]*")


def redact(text: str) -> str:
    """``text`` with every URL's credentials masked."""
    text = _USERINFO.sub(lambda m: f"{m.group('scheme')}***@", text)
    text = _BARE_USERINFO.sub("***@", text)
    return _QUERY.sub(lambda m: f"{m.group('name')}***", text)
