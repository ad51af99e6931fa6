"""Secrets never reach MLflow: what the tracker writes (params, tags, config, JSON artefacts) passes through here.

Masked: values under secret-looking keys (`hf_token`, `password`, `api_key`, ...), the password of any URL
(`postgresql://user:***@host`), strings shaped like well-known tokens (Hugging Face, GitHub, OpenAI, AWS,
Slack), and the value of any environment variable with a secret-looking name (HF_TOKEN, *_PASSWORD, ...).
"""
from __future__ import annotations

import logging
import os
import re
import sys

MASK = "***"
SECRET_KEY = re.compile(r"(^|[._-])(hf_)?(token|auth_token|password|passwd|secret|api_?key|access_?key|secret_?key|"
                        r"private_?key|credentials?)$", re.IGNORECASE)
SECRET_ENV = re.compile(r"(^|_)(TOKEN|PASSWORD|PASSWD|SECRET|API_?KEY|ACCESS_?KEY|SECRET_?KEY|PRIVATE_?KEY|"
                        r"CREDENTIALS?)$", re.IGNORECASE)
# greedy up to the last @ before the path: a password may hold an @ itself. Hydra echoes an override with its
# colons escaped (postgresql\://user\:pw@host), so a backslash may precede either colon.
URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*\\?://[^:/@\s\\]*)(?P<colon>\\?:)(?P<password>[^/\s]+)@",
                          re.IGNORECASE)
# key=value in query strings and libpq DSNs (?access_token=..., password=...), and bearer credentials
KEY_VALUE = re.compile(r"(?P<key>\b(?:[a-z_]*token|password|passwd|secret|api_?key|access_?key|client_secret)=)"
                       r"(?P<value>[^&\s'\"]+)", re.IGNORECASE)
BEARER = re.compile(r"(?P<head>\b(?:Bearer|Basic|Token)\s+)[A-Za-z0-9._~+/=-]{8,}(?<!\.)", re.IGNORECASE)
TOKEN_SHAPES = re.compile(r"\b(hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|AKIA[0-9A-Z]{16}|"
                          r"xox[abprs]-[A-Za-z0-9-]{10,})\b")
MIN_ENV_SECRET = 6   # shorter values ("1", "true") would mask ordinary text


def env_secrets() -> list[str]:
    return sorted((v for k, v in os.environ.items() if SECRET_ENV.search(k) and len(v) >= MIN_ENV_SECRET),
                  key=len, reverse=True)


def scrub_text(text: str) -> str:
    text = URL_PASSWORD.sub(rf"\g<head>\g<colon>{MASK}@", str(text))
    text = KEY_VALUE.sub(rf"\g<key>{MASK}", text)
    text = BEARER.sub(rf"\g<head>{MASK}", text)
    text = TOKEN_SHAPES.sub(MASK, text)
    for value in env_secrets():
        text = text.replace(value, MASK)
    return text


def is_secret_key(key) -> bool:
    return bool(SECRET_KEY.search(str(key)))


def scrub_tree(obj):
    """A copy of nested dicts/lists/strings with secret keys masked and every string scrubbed."""
    if isinstance(obj, dict):
        return {k: (MASK if is_secret_key(k) and v not in (None, "") else scrub_tree(v)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(scrub_tree(v) for v in obj)
    if isinstance(obj, str):
        return scrub_text(obj)
    return obj


def scrub_params(params: dict[str, str]) -> dict[str, str]:
    return {k: (MASK if is_secret_key(k) and v not in ("None", "") else scrub_text(v)) for k, v in params.items()}


class ScrubbedStream:
    """A console stream whose every write is scrubbed: stdout and stderr of the CLI, whatever prints there
    (our messages, Hydra's, a library's warning)."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(scrub_text(text))
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name):   # isatty, fileno, encoding, flush, ...: the wrapped stream's
        return getattr(self.stream, name)


def guard_console() -> None:
    """Scrub what the CLI prints and what anything logs (the record itself, so every handler Hydra or a
    library installs later writes the scrubbed text)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if not isinstance(stream, ScrubbedStream):
            setattr(sys, name, ScrubbedStream(stream))
    factory = logging.getLogRecordFactory()
    if not getattr(factory, "scrubs", False):
        logging.setLogRecordFactory(_scrubbing_factory(factory))


def _scrubbing_factory(make_record):
    def scrubbed_record(*args, **kwargs):
        record = make_record(*args, **kwargs)
        try:
            record.msg, record.args = scrub_text(record.getMessage()), None
        except (TypeError, ValueError):   # a malformed format: logging reports it as usual
            pass
        return record

    scrubbed_record.scrubs = True
    return scrubbed_record
