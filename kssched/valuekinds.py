"""The kinds of value a setting takes (kssched.variables): what each allows, and
how its text is parsed. No Django here, as in kssched.variables."""

import ipaddress
import math
import re
from dataclasses import dataclass
from urllib.parse import urlsplit


class SettingError(ValueError):
    """A variable's value is not valid; `str()` is the one line to show."""

    def __init__(self, name: str, value: str, allowed: str) -> None:
        self.name, self.value, self.allowed = name, value, allowed
        super().__init__(f"{name}={value!r} is not valid: {allowed}")


# Each has `allowed` (shown in errors and in docs/settings.md) and `parse(text)`, which
# returns the value or raises ValueError.

_PLAIN_NUMBER = re.compile(r"[0-9]+(\.[0-9]+)?")
_WHOLE_NUMBER = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class Number:
    """A plain decimal number: no sign, exponent, `nan`, `inf` or unit."""

    what: str  # "a number of days", "a whole number of seconds"
    example: str
    minimum: float = 0
    # True: the value must be above `minimum`; False: at least `minimum`.
    above: bool = True
    whole: bool = False
    maximum: int | None = None

    @property
    def allowed(self) -> str:
        bound = f"> {self.minimum:g}" if self.above else f">= {self.minimum:g}"
        if self.maximum is not None:
            bound = f"{bound} and <= {self.maximum}"
        return f"{self.what} {bound} (e.g. {self.example})"

    def parse(self, text: str) -> int | float:
        pattern = _WHOLE_NUMBER if self.whole else _PLAIN_NUMBER
        if not pattern.fullmatch(text):
            raise ValueError(text)
        value: int | float = int(text) if self.whole else float(text)
        too_small = value <= self.minimum if self.above else value < self.minimum
        if too_small or not math.isfinite(value):
            raise ValueError(text)
        if self.maximum is not None and value > self.maximum:
            raise ValueError(text)
        return value


@dataclass(frozen=True)
class Choice:
    names: tuple[str, ...]
    ignore_case: bool = False

    @property
    def allowed(self) -> str:
        return "one of " + ", ".join(self.names)

    def parse(self, text: str) -> str:
        value = text.lower() if self.ignore_case else text
        if value not in self.names:
            raise ValueError(text)
        return value


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class OrAuto:
    """`auto` (returned as "auto"), or a value of `kind`."""

    kind: Number

    @property
    def allowed(self) -> str:
        return f"auto, or {self.kind.allowed}"

    def parse(self, text: str) -> int | float | str:
        return "auto" if text.lower() == "auto" else self.kind.parse(text)


@dataclass(frozen=True)
class Flag:
    allowed: str = "true or false (also 1/0, yes/no, on/off)"

    def parse(self, text: str) -> bool:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ValueError(text)


@dataclass(frozen=True)
class Text:
    allowed: str = "any text"
    required: bool = False

    def parse(self, text: str) -> str:
        if self.required and not text:
            raise ValueError(text)
        return text


@dataclass(frozen=True)
class TextList:
    allowed: str = "comma-separated values"

    def parse(self, text: str) -> list[str]:
        return [item.strip() for item in text.split(",") if item.strip()]


# A Kubernetes label key: an optional DNS subdomain prefix and "/", then a name of at
# most 63 characters, alphanumeric at both ends, with "-", "_" or "." inside.
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(
    r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*"
)


@dataclass(frozen=True)
class LabelKey:
    allowed: str = (
        "a Kubernetes label key: an optional DNS prefix and '/', then 1-63 letters, "
        "digits, '-', '_' or '.', starting and ending with a letter or digit "
        "(e.g. ks-pipeline or example.com/pipeline)"
    )

    def parse(self, text: str) -> str:
        prefix, _, name = text.rpartition("/")
        if not _LABEL_NAME.fullmatch(name):
            raise ValueError(text)
        if "/" in text and not (
            len(prefix) <= 253 and _DNS_SUBDOMAIN.fullmatch(prefix)
        ):
            raise ValueError(text)
        return text


@dataclass(frozen=True)
class Bind:
    """A TCP listening address, HOST:PORT ([::1]:PORT for IPv6), or unix:PATH."""

    allowed: str = (
        "HOST:PORT with an IP address or host name and a port 0-65535 "
        "(e.g. 127.0.0.1:8081 or [::1]:8081), or unix:PATH"
    )
    unix: bool = True
    # Empty turns the listener off.
    optional: bool = False

    def parse(self, text: str) -> str:
        if self.optional and not text:
            return text
        if self.optional and text.endswith(":0"):
            raise ValueError(text)
        if self.unix and text.startswith("unix:") and len(text) > 5:
            return text
        host, sep, port = text.rpartition(":")
        if not sep or not _WHOLE_NUMBER.fullmatch(port) or int(port) > 65535:
            raise ValueError(text)
        if host.startswith("["):
            if not host.endswith("]"):
                raise ValueError(text)
            ipaddress.IPv6Address(host[1:-1])
        elif not host or not re.fullmatch(r"[A-Za-z0-9.-]+", host):
            raise ValueError(text)
        return text


def bind_parts(address: str) -> tuple[str, int]:
    """(host, port) of a HOST:PORT address as Bind accepts it, without IPv6 brackets."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


_DATABASE_SCHEMES = ("postgres", "postgresql", "pgsql", "sqlite")


@dataclass(frozen=True)
class DatabaseUrl:
    allowed: str = (
        "empty (the SQLite file at DATA_PATH), postgres://USER:PASSWORD@HOST:PORT/NAME "
        "or sqlite:////ABSOLUTE/PATH"
    )

    def parse(self, text: str) -> str:
        if text and urlsplit(text).scheme not in _DATABASE_SCHEMES:
            raise ValueError(text)
        return text


def is_loopback_bind(address: str) -> bool:
    if address.startswith("unix:"):
        return True
    host = bind_parts(address)[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
