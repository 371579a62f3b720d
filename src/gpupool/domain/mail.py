"""sbatch's ``--mail-type`` / ``--mail-user``: which of a job's moments are told, and to whom.

Words:

- **mail types** (Slurm's names): ``BEGIN`` (the job started running), ``END`` (it ended, in
  any state), ``FAIL`` (it ended in a failure: ``FAILED``, ``TIMEOUT``, ``OUT_OF_MEMORY``,
  ``BOOT_FAIL``, ``NODE_FAIL``, ``PREEMPTED``), ``REQUEUE`` (it went back to the queue);
  ``ALL`` is all four, ``NONE`` none. Several are joined by ``,`` (``BEGIN,END``). A job's end is
  told once: with ``END`` or, for a failure, ``FAIL`` (a failure asked for with both is one
  message). An end followed at once by a requeue is told as the requeue only.
- **mail user**: where the notices go: an e-mail address (sent through the server's SMTP host)
  or an ``http://``/``https://`` URL (a webhook: a JSON POST). Without one, the server's
  configured webhook, if it has one.

Pure: the server's :mod:`gpupool.control.notify` sends; this module only parses and decides.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from gpupool.domain.errors import InvalidValue
from gpupool.domain.states import JobState

#: The types a job may ask for, in Slurm's order.
MAIL_TYPES = ("BEGIN", "END", "FAIL", "REQUEUE")
_ALIASES = {"ALL": MAIL_TYPES, "NONE": ()}
FAILURES = frozenset(
    {
        JobState.FAILED,
        JobState.TIMEOUT,
        JobState.OUT_OF_MEMORY,
        JobState.BOOT_FAIL,
        JobState.NODE_FAIL,
        JobState.PREEMPTED,
    }
)
_ENDS = FAILURES | {JobState.COMPLETED, JobState.CANCELLED}
_EMAIL_RE = re.compile(r"^[A-Za-z0-9._%+'-]{1,64}@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*$")
MAX_URL = 2000


class MailError(ValueError):
    """A ``--mail-type`` or ``--mail-user`` that cannot be used; the message says what to pass."""


def parse_mail_type(value: object) -> tuple[str, ...]:
    """``"BEGIN,END"``, ``"all"`` or a list of names -> the types, in :data:`MAIL_TYPES` order."""
    if isinstance(value, str):
        parts = value.split(",")
    elif isinstance(value, list | tuple):
        parts = [str(v) for v in value]
    else:
        raise MailError("expected names such as BEGIN,END or ALL")
    wanted: set[str] = set()
    for raw in parts:
        name = raw.strip().upper()
        if name in _ALIASES:
            wanted.update(_ALIASES[name])
        elif name in MAIL_TYPES:
            wanted.add(name)
        else:
            raise MailError(
                f"{raw.strip()!r} is not a mail type: use BEGIN, END, FAIL, REQUEUE, ALL or NONE "
                "(several joined by ',')"
            )
    return tuple(t for t in MAIL_TYPES if t in wanted)


def is_webhook(user: str) -> bool:
    return user.startswith(("http://", "https://"))


def parse_mail_user(value: object) -> str:
    """An e-mail address or an http(s) URL, as given (see the module docstring)."""
    if not isinstance(value, str) or not value.strip():
        raise MailError("expected an e-mail address or an https:// URL")
    text = value.strip()
    if is_webhook(text):
        if not _valid_url(text):
            raise MailError(f"{text[:80]!r} is not a URL a webhook can be sent to")
        return text
    if not _EMAIL_RE.match(text):
        raise MailError(
            f"{text[:80]!r} is neither an e-mail address (name@example.org) nor an "
            "http(s):// URL for a webhook"
        )
    return text


def shown_mail_user(user: str) -> str:
    """``user`` as job views show it: an address whole; a webhook URL cut to its scheme and
    host (``https://hooks.example.org/...``), since its path often is its secret."""
    if not is_webhook(user):
        return user
    parts = urlsplit(user)
    rest = "/..." if (parts.path not in ("", "/") or parts.query) else ""
    return f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}{rest}"


def mail_event(types: tuple[str, ...], state: JobState) -> str | None:
    """The type to tell for a job entering ``state``, or ``None`` (see the module docstring)."""
    if not types:
        return None
    if state is JobState.RUNNING:
        return "BEGIN" if "BEGIN" in types else None
    if state is JobState.REQUEUED:
        return "REQUEUE" if "REQUEUE" in types else None
    if state in _ENDS:
        if state in FAILURES and "FAIL" in types:
            return "FAIL"
        return "END" if "END" in types else None
    return None


def check_mail_settings(sender: str, webhook: str | None) -> None:
    """The server's ``--smtp-from`` and ``--mail-webhook``; raises InvalidValue naming them."""
    if not _EMAIL_RE.match(sender):
        raise InvalidValue(
            f"--smtp-from {sender!r} is not an e-mail address: use e.g. gpupool@example.org",
            field="smtp_from",
        )
    if webhook is not None and not (is_webhook(webhook) and _valid_url(webhook)):
        raise InvalidValue(
            f"--mail-webhook {webhook[:80]!r} is not an http(s):// URL: use e.g. "
            "https://chat.example.org/hooks/gpupool",
            field="mail_webhook",
        )


def _valid_url(text: str) -> bool:
    return (
        len(text) <= MAX_URL
        and not any(c.isspace() for c in text)
        and bool(urlsplit(text).hostname)
    )
