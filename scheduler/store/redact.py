"""Secrets out of anything a person or a log reads: the password of a Redis
URL (``user:password@``, ``?password=``, ``?sentinel_password=``) becomes ``***``.

Two ways, because a password need not be percent-encoded (a base64 one holds
``/``; others ``#``, ``?``, ``@``, ``%`` or a space), and then no parser can
tell where it ends:

* by shape: the userinfo of a ``scheme://`` URL runs to the *last* ``@`` of
  its token (so ``/ # ? @ %`` inside it are masked with it), or, when the
  token is ``user:pass`` alone, to the last ``@`` on the line before the
  next URL (a space inside the password); a query's password runs to ``&``
  or a space.
  This masks more than the password in rare texts, never less;
* by value: every address this process is given (:func:`remember`, called by
  :func:`scheduler.store.connection.parse_address` and ``describe_target``) has
  its secrets noted, and each noted secret of :data:`MIN_NOTED` characters
  or more is masked wherever it appears, as given and percent-decoded.
"""

from __future__ import annotations

import re
import threading
from urllib.parse import quote, unquote

_SCHEME = r"\b[A-Za-z][A-Za-z0-9+.-]*://"
# scheme://userinfo@: up to the last @ of the URL's token
_USERINFO = re.compile(rf"(?P<scheme>{_SCHEME})\S*@(?=[^\s@]*(?:\s|$))")
# scheme://user:pass word@host: a first token of user:pass (no / nor @), then
# (before the line's end or the next URL) text whose last @ precedes a host
_SPACED_USERINFO = re.compile(
    rf"(?P<scheme>{_SCHEME})[^\s/@]*:[^\s/@]*\s(?:(?!{_SCHEME})[^\n])*?"
    r"@(?=[\w.\-\[\]]+(?::\d+)?(?:[/,?\s]|$))(?![^\n]*@)"
)
# host:port forms without a scheme, as the reference's redis_addr allows
_BARE_USERINFO = re.compile(r"^(?![^\s/:@]*://)[^\s/:@]*:[^\n]*@(?=[^\s@]+$)")
_QUERY = re.compile(r"(?i)(?P<name>[?&](?:\w*password|pass|pwd|auth|token)=)[^&\s]*")

#: secrets shorter than this are masked only by shape (masking every "ab" in
#: every message would mangle them)
MIN_NOTED = 4
_noted: set[str] = set()
_lock = threading.Lock()


def _secrets_of(address: str) -> list[str]:
    """The password-like parts of one address, however unencoded: the
    userinfo's after its first ``:``, up to the address's last ``@``; and
    each password-like query value."""
    out = []
    text = address.strip()
    body = text.split("://", 1)[1] if "://" in text else text
    if "@" in body:
        userinfo = body.rsplit("@", 1)[0]
        if ":" in userinfo:  # (without one it is a user name: redis://user@host)
            out.append(userinfo.partition(":")[2])
    for m in _QUERY.finditer(text):
        out.append(m.group(0)[len(m.group("name")) :])
    return [s for s in out if s]


def remember(address: str | None) -> None:
    """Note the secrets of an address this process was given, so that
    :func:`redact` masks them wherever they appear."""
    if not address:
        return
    forms = set()
    for secret in _secrets_of(address):
        forms |= {secret, unquote(secret), quote(unquote(secret), safe="")}
    with _lock:
        _noted.update(f for f in forms if len(f) >= MIN_NOTED)


def redact(text: str) -> str:
    """``text`` with every URL's credentials masked."""
    # (the query first: a password there may hold the @ the userinfo ends at)
    text = _QUERY.sub(lambda m: f"{m.group('name')}***", text)
    text = _USERINFO.sub(lambda m: f"{m.group('scheme')}***@", text)
    text = _SPACED_USERINFO.sub(lambda m: f"{m.group('scheme')}***@", text)
    text = _BARE_USERINFO.sub("***@", text)
    with _lock:
        noted = sorted(_noted, key=len, reverse=True)  # (a longer one first)
    for secret in noted:
        if secret in text:
            text = text.replace(secret, "***")
    return text
