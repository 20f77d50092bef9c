"""`redact`, which hides every URL's credentials in text shown or stored, and `has_password`. Hand-written: no URL
parser finds URLs inside prose, and urllib ends a password at its first `/?#@`, which shows the rest of one that
holds them."""

from __future__ import annotations

import re

# scheme://USER:SECRET@host and scheme://TOKEN@host -> scheme://***@host: the user may be the secret itself (a token
# given as the user, or as the user of `TOKEN:x-oauth-basic@`), so the whole userinfo goes. A user alone ends at its
# `@`. SQLAlchemy ends a password at its first `@`, browsers and urllib at the first `/?#`; a password may hold any of
# them, a space or a quote, so the secret runs to the LAST `@` that a host follows, on that line and before the next
# URL: more is hidden, never less.
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_USER = re.compile(r"[^/\s:@'\"?#]*")
_END = r"(?=[/?#\s'\"),;]|$)"
_AT_HOST = re.compile(r"@(?:\[[0-9A-Fa-f:.]*\]|[\w.%~-]*)(?::\d+)?" + _END)
_WORD = re.compile(r"\S*")
_PORT = re.compile(r"\d{1,5}" + _END)  # scheme://host:PORT/...: no userinfo unless an @host follows in the word
# the query (or fragment, or `;` parameter) names whose values are secrets, matched anywhere in the name and in any
# case: api_key, X-Amz-Signature, AccessToken, sslpassword, client_secret, ...
_NAMES = r"[\w.-]*(?:password|passwd|pwd|secret|token|credential|key|auth|sig|session|jwt|bearer|cookie)[\w.-]*"
_VALUE = r"(?P<secret>(?:[^&\s'\"]|['\"](?![\s),;]|$))*)"  # a quote ends the value only where the URL ends
_QUERY = re.compile(rf"(?P<head>[?&;#]{_NAMES}=){_VALUE}", re.I)
_ENCODED = re.compile(rf"(?P<head>{_NAMES}%3D){_VALUE}", re.I)  # options=-c%20password%3DSECRET
# USER:SECRET@host without its scheme (a forgotten `postgresql://` or `http://`): the whole userinfo goes here too.
# Without a scheme nothing marks a URL, and prose holds `word:` and e-mail addresses (`name@host`, no secret), so
# the form is `word:` at a word's start with an `@` later in the same word (no space), and the secret runs to that
# word's last `@`. A password holding a space is covered only with a scheme.
_BARE = re.compile(r"(?<![\w.%+~:/@-])[\w.%+~-]+:(?!//)(?=[^\s@]*@)")


def _redact_userinfo(text: str, users: bool = True) -> str:
    out, pos = [], 0
    while m := _SCHEME.search(text, pos):
        start = m.end()
        user = _USER.match(text, start).end()
        after = text[user : user + 1]
        if after == "@" and users and _AT_HOST.match(text, user):  # scheme://USER@host: the user alone
            out.append(text[pos:start] + "***")
            pos = user
            continue
        if after != ":":
            out.append(text[pos:start])
            pos = start
            continue
        line = text.find("\n", user)
        line = len(text) if line < 0 else line
        nxt = text.find("://", user, line)
        limit = line if nxt < 0 else nxt
        ats = [a.start() for a in _AT_HOST.finditer(text, user + 1, limit)]
        word = _WORD.match(text, user + 1).end()
        if not ats or (_PORT.match(text, user + 1) and ats[0] > word):
            out.append(text[pos:start])
            pos = start
            continue
        out.append(text[pos:start] + "***")
        pos = ats[-1]
    return "".join(out) + text[pos:]


def _redact_bare(text: str) -> str:
    out, pos = [], 0
    while m := _BARE.search(text, pos):
        word = _WORD.match(text, m.end()).end()
        at = text.rfind("@", m.end(), word)
        out.append(text[pos : m.start()] + "***")
        pos = at
    return "".join(out) + text[pos:]


def _redact(text, users: bool = True) -> str:
    hidden = _redact_bare(_redact_userinfo(str(text), users))
    return _ENCODED.sub(lambda m: f"{m['head']}***", _QUERY.sub(lambda m: f"{m['head']}***", hidden))


def redact(text) -> str:
    """`text` with every credential of every URL in it replaced by ***: the user and password (the whole userinfo,
    `scheme://***@host`, and `***@host` where `user:password@host` lacks its scheme) and the values of secret-like
    query, fragment and `;` parameters (token, api_key, key, secret, password, auth, sig, ...; also URL-encoded,
    `password%3D...`).

    The one helper for anything shown or stored: messages, log lines, MLflow params and tags, CSVs, manifests."""
    return _redact(text)


def has_password(url: str) -> bool:
    """Whether `url` holds a secret that DVC would write to dvc.lock: a password, a secret-like query value, or a
    user alone in an http(s) URL (an MLflow server takes a token as the user). A database URL's user alone is a role
    name, the form docs/scale-out.md recommends (its password in PGPASSWORD or ~/.pgpass): no secret."""
    return _redact(url, users=url.lower().startswith("http")) != url
