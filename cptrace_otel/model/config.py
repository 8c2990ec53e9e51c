"""Configuration: every environment variable the project reads, parsed once into a frozen :class:`Config`.

Precedence for each setting: an explicit :func:`cptrace_otel.configure` argument, then the cptrace variable, then the
standard OpenTelemetry variable (signal-specific ``OTEL_EXPORTER_OTLP_TRACES_*`` before the generic
``OTEL_EXPORTER_OTLP_*``), then the default. A bad value warns once and falls back to the default; it never raises
into the traced process.

Secrets: the endpoint's userinfo (``http://user:pass@host``) and every header value are secrets, and so is each
credential inside them (the token after ``Bearer``, a ``Basic`` credential's decoded user and password), in every
form a server may echo it (as is, percent-encoded, base64: :func:`secrets_of` builds the set once per sink). Every
message, ``stats()`` figure and error text that may hold them, including what a server answered, goes through
:func:`mask` (one helper, used by the sinks, the sender, the backend clients and the commands): userinfo becomes
``***@`` and every secret form ``***``.

Variables (README.md's configuration table lists the same):

==================================  ==========================================================================
``CPTRACE_LEVEL``                   trace level 0-3; else ``SGLANG_CP_HICACHE_KV_TRACE`` (upstream gate); else 0
``CPTRACE_RUN_ID``                  run id shared by all ranks of one launch (derived when unset, see run_id)
``CPTRACE_FILE``                    OTLP JSON-lines output file; ``{pid}``, ``{rank}``, ``{run_id}`` expand
``CPTRACE_LOG_FILE``                also write upstream ``[CPTRACE tag] k=v`` lines here (same placeholders)
``CPTRACE_CP_RANK`` / ``_TP_RANK``  this process's CP / TP / DP rank (resource attributes); -1 = unknown, found
``CPTRACE_DP_RANK``                 by :mod:`cptrace_otel.traced.ranks` (config record, SGLang, torch.distributed, env)
``CPTRACE_RANK_WAIT_S``             longest the first records wait for an unknown rank to be found (default 2.0)
``CPTRACE_SAMPLE``                  fraction of node lineages kept, 0 < f <= 1 (default 1: all); see sampling
``CPTRACE_QUEUE_SIZE``              records buffered in the traced process before drops (default 262144)
``CPTRACE_EXPORTER``                ``process`` (default: a per-rank exporter subprocess) or ``thread``
``CPTRACE_SPOOL_DIR``               where OTLP requests wait while the backend is unreachable
``CPTRACE_SPAN_TIMEOUT_S``          longest a stage span stays open (default 1.0)
``CPTRACE_CHECKS``                  ``1`` (default) runs the per-rank invariant checks online; ``0`` turns them off
``CPTRACE_QUEUE_BYTES``             estimated bytes buffered in the traced process before drops (default 64 MiB)
``CPTRACE_RING``                    ``1`` (default): with the exporter process, records go to it through a
                                    shared-memory ring encoded on the caller's thread (:mod:`cptrace_otel.traced.ring`);
                                    ``0``: every record takes the buffer and the drainer thread (as thread mode does)
``CPTRACE_RING_BYTES``              the ring's size in bytes (default 64 MiB, as CPTRACE_QUEUE_BYTES; a power of two);
                                    both at most 1/8 of physical memory or the cgroup limit (:func:`memory_limit`)
``OTEL_EXPORTER_OTLP_[TRACES_]*``   ENDPOINT, PROTOCOL (http/protobuf, grpc), HEADERS, TIMEOUT, COMPRESSION,
                                    CERTIFICATE, CLIENT_CERTIFICATE, CLIENT_KEY (PEM files), INSECURE (gRPC)
``OTEL_SERVICE_NAME``               resource service.name (default ``sglang-hicache``)
``OTEL_RESOURCE_ATTRIBUTES``        extra resource attributes ``k=v,k2=v2``
==================================  ==========================================================================
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import os
import re
import socket
import warnings
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote, quote_plus, unquote, urlsplit

from .exits import EXIT_USAGE, CptraceError
from .grammar import RING

DEFAULT_FILE = "cptrace-out/{run_id}/rank-{rank}-{pid}.otlp.jsonl"
TRACES_PATH = "/v1/traces"  # the OTLP/HTTP signal path for traces
DEFAULT_HTTP_ENDPOINT = "http://localhost:4318"
DEFAULT_GRPC_ENDPOINT = "http://localhost:4317"

_warned: set[str] = set()

# A URL's userinfo, whatever its shape: from the scheme's "//" to the LAST "@" before the next white space or quote,
# or, for a first word with no "//" (a scheme-less endpoint, user:pass@host:4317), from its start to its last "@".
# A malformed password ("p/ss", "p@ss", "p#ss", "p?ss") must be masked whole, so the authority's usual end ("/", "?",
# "#") does not end it here; an "@" in a path is masked too (the safe side).
_USERINFO_RE = re.compile(r"(?<=//)[^\s\"<>]*@|^(?![^\s\"<>]*//)[^\s\"<>]*@")
_MASKED = "***"


def mask_url(url: str) -> str:
    """``url`` (or a text quoting URLs) with any userinfo (``user:pass@``) replaced by ``***@``, whatever the URL's
    shape: everything from ``//`` to the last ``@`` before white space or a quote; a first word with no ``//`` that
    holds an ``@`` (a scheme-less endpoint, ``user:pass@host:4317``) is masked up to its last ``@``."""
    return _USERINFO_RE.sub(_MASKED + "@", url) if "@" in url else url


# A credential piece or encoded form shorter than MIN_SECRET_CHARS is not masked (it would garble text, and a 1-3
# character piece of a longer credential gives little away); a whole configured value (a header value, the userinfo,
# the password) as it was given is masked from MIN_WHOLE_CHARS on (a 1-2 character value protects nothing).
MIN_SECRET_CHARS = 4
MIN_WHOLE_CHARS = 3


def mask(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with URL userinfo masked and every string of ``secrets`` (the forms :func:`secrets_of` builds:
    credentials, the pieces inside them, their percent-encoded and base64 forms) replaced by ``***``. The one masking
    helper: every message that may quote an endpoint, a header, an error raised while using them, or what a server
    answered (a body, a ``Location``, gRPC status details) goes through it. Strings shorter than
    :data:`MIN_WHOLE_CHARS` are not masked (:func:`secrets_of` applies the rule for pieces). Masking repeats until
    no secret is left (a replacement may join the text around it into one), so no form survives in the result."""
    text = str(text)
    pattern = _secrets_pattern(tuple(secrets))
    if pattern is not None:
        # Each pass that changes the text shortens it (a form of >= 4 characters becomes 3) or turns characters into
        # "*" (a 3-character form): it ends.
        while True:
            new = pattern.sub(_MASKED, text)
            if new == text:
                break
            text = new
    if "@" in text and "//" in text:
        text = _USERINFO_RE.sub(_MASKED + "@", text)
    return text


@functools.lru_cache(maxsize=64)
def _secrets_pattern(secrets: tuple[str, ...]) -> re.Pattern[str] | None:
    """One alternation of ``secrets``, longest first so a form containing another is masked whole; compiled once
    per set of secrets (each sink builds its set once)."""
    forms = sorted({s for s in secrets if isinstance(s, str) and len(s) >= MIN_WHOLE_CHARS}, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, forms))) if forms else None


def userinfo_of(endpoint: str) -> str:
    """The userinfo of an endpoint value, whatever its shape (between ``//`` or the start, and the last ``@``);
    "" when it has none."""
    if "@" not in endpoint:
        return ""
    i = endpoint.find("//")
    start = i + 2 if i >= 0 else 0
    end = endpoint.rfind("@")
    return endpoint[start:end] if end >= start else ""


_AUTH_SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")  # "Bearer", "Basic", "Token", "ApiKey": not secret


def credential_pieces(value: str) -> set[str]:
    """The credential strings of one header value: the value (raw and stripped); what follows a leading
    auth-scheme word (``Bearer``/``Basic``/...: text, not a secret), whole; each word of it (split at ASCII white
    space), each comma-separated part of a word and the value of a ``k=v`` / ``k="v"`` part (Digest-style
    parameters, not the parameter's name); for ``Basic``, the decoded ``user:password``, its user and its
    password."""
    v = value.strip(" \t")   # HTTP's white space (a non-ASCII space may be part of a token)
    out = {value, v, value.strip()}
    words = [w for w in re.split(r"[ \t\r\n]+", v) if w]
    scheme = ""
    if len(words) > 1 and _AUTH_SCHEME_RE.fullmatch(words[0]):
        scheme, words = words[0].lower(), words[1:]
        out.add(v[v.index(words[0]):])   # the credential after the scheme word, whole
    for w in words:
        out.add(w)
        for part in w.split(","):   # Digest-style parameters: k=v, k="v"
            out.add(part)
            _k, eq, val = part.partition("=")
            if eq and _k and val.strip('"'):
                out.add(val.strip('"'))
        if scheme == "basic":
            try:
                dec = base64.b64decode(w, validate=True).decode("utf-8")
            except (ValueError, UnicodeDecodeError):
                continue
            user, _, pw = dec.partition(":")
            out.update((dec, user, pw))
    return out


def secret_forms(piece: str) -> set[str]:
    """Every way a server may echo ``piece``: as is, percent-encoded (``%20`` or ``+`` for a space, upper- or
    lower-case hex, ``/`` kept or not) and in base64 (standard and URL-safe, with or without padding)."""
    out = {piece, quote(piece, safe=""), quote(piece), quote_plus(piece)}
    out |= {_PCT_RE.sub(lambda m: m.group(0).lower(), f) for f in list(out)}
    raw = piece.encode("utf-8", "surrogatepass")
    for b in (base64.b64encode(raw), base64.urlsafe_b64encode(raw)):
        t = b.decode("ascii")
        out.update((t, t.rstrip("=")))
    return out


_PCT_RE = re.compile(r"%[0-9A-F]{2}")


def secrets_of(endpoint: str | None, headers: Iterable[tuple[str, str]] = ()) -> tuple[str, ...]:
    """The secret strings of a sink's (or a backend client's) settings, built once by whoever holds the settings
    and handed to :func:`mask`: every header value and the endpoint's userinfo (raw and percent-decoded, whole, the
    user, the password and ``user:password``, which is also what basic auth sends), with the credential pieces
    inside a header value (:func:`credential_pieces`), each in all of its :func:`secret_forms`. Pieces shorter than
    :data:`MIN_SECRET_CHARS` are left out, except the configured values themselves, as given (a header value, the
    userinfo, its password), kept from :data:`MIN_WHOLE_CHARS`. Longest first."""
    pieces: set[str] = set()
    whole: set[str] = set()
    for _k, v in headers:
        pieces |= credential_pieces(v)
        whole.update((v, v.strip()))
    ui = userinfo_of(endpoint) if endpoint else ""
    if ui:
        user, _, pw = ui.partition(":")
        pieces.update((ui, unquote(ui), user, unquote(user), pw, unquote(pw), f"{unquote(user)}:{unquote(pw)}"))
        whole.update((ui, unquote(ui), pw, unquote(pw)))
    out = {w for w in whole if len(w) >= MIN_WHOLE_CHARS}
    for p in pieces:
        if len(p) >= MIN_SECRET_CHARS:
            out |= {f for f in secret_forms(p) if len(f) >= MIN_SECRET_CHARS}
    return tuple(sorted(out, key=len, reverse=True))


# The CP modes of docs/domain.md section 5 (the ``config`` record's ``mode``); ``prefill_cp`` is stock SGLang's prefill
# context parallelism: every CP rank holds the whole KV (replicated), under L3 keys of its own.
CP_MODES = ("none", "replicated", "prefill_cp", "sharded", "dcp", "layersplit", "shared")


def cp_mode_setting(value: str | None, what: str) -> str:
    """A CP mode someone set (``CPTRACE_CP_MODE``, ``instrument(cp_mode=...)``): the mode, ``""`` when unset; a value
    that is not one of :data:`CP_MODES` is warned about once and ignored (the mode is then derived)."""
    v = (value or "").strip().lower()
    if not v or v in CP_MODES:
        return v
    _warn_once("cpmode" + v, f"{what}={value!r} is not a CP mode ({', '.join(CP_MODES)}); ignored, the mode is "
               "derived from SGLang's server arguments")
    return ""


def forget_warnings() -> None:
    """Forget which configuration warnings were given, so each is given again once (a test that expects one)."""
    _warned.clear()


def _warn_once(key: str, msg: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"cptrace_otel: {msg}", RuntimeWarning, stacklevel=3)


@dataclasses.dataclass(frozen=True, repr=False)
class Config:
    """Everything the project reads from the environment, resolved. Build with :func:`from_env`. Its ``repr``
    masks the endpoint's userinfo and the header values."""

    level: int = 0
    run_id: str = ""
    endpoint: str | None = None          # OTLP base or full traces URL; None = no network sink
    protocol: str = "http/protobuf"      # or "grpc"
    headers: tuple[tuple[str, str], ...] = ()
    timeout_s: float = 10.0
    compression: str = "gzip"            # or "none"
    file: str | None = None              # OTLP JSON-lines path (placeholders expanded by :meth:`expand`)
    log_file: str | None = None
    cp_rank: int = -1
    tp_rank: int = -1
    dp_rank: int = -1
    queue_size: int = 262144
    exporter: str = "process"
    spool_dir: str = ""
    spool_max_bytes: int = 512 << 20     # disk spool cap per exporter (orphaned spools adopted count against it)
    span_timeout_s: float = 1.0
    checks: bool = True
    service_name: str = "sglang-hicache"
    resource_attributes: tuple[tuple[str, str], ...] = ()
    queue_bytes: int = 64 << 20          # estimated bytes of buffered records before drops
    ring: bool = True                    # CPTRACE_RING: the shared-memory record ring (cptrace_otel.traced.ring)
    ring_bytes: int = 64 << 20
    certificate: str | None = None       # PEM CA bundle that verifies the backend (https / secure gRPC)
    client_certificate: str | None = None  # PEM client certificate (mTLS), with client_key
    client_key: str | None = None
    insecure: bool | None = None         # OTEL_EXPORTER_OTLP_[TRACES_]INSECURE; None when unset (gRPC only)
    run_id_given: bool = False           # run_id was set (CPTRACE_RUN_ID or an override), not derived
    rank_wait_s: float = 2.0
    sample: float = 1.0                  # fraction of node lineages kept (cptrace_otel.model.sampling)
    rank_source: str = ""                # where cp_rank came from when it was discovered (cptrace_otel.traced.ranks)
    sglang_exact: bool = False           # CPTRACE_SGLANG_EXACT: the SGLang instrumentation adds devx/hostx/idx_x
    cp_mode: str = ""                    # CPTRACE_CP_MODE: the SGLang instrumentation's CP mode ("": derived)

    def __repr__(self) -> str:
        body = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self))
        return mask(f"Config({body})", secrets_of(self.endpoint, self.headers))

    def expand(self, template: str) -> str:
        """Fill ``{pid}``, ``{rank}`` and ``{run_id}`` in an output path template. An unknown rank is ``unknown``
        (a name never reads like a rank that the process does not have)."""
        rank = self.cp_rank if self.cp_rank >= 0 else "unknown"
        return template.format(pid=os.getpid(), rank=rank, run_id=self.run_id)

    def traces_url(self) -> str | None:
        """Full OTLP traces URL: a signal-specific endpoint is used as is, a generic one gets ``/v1/traces``
        (already applied by :func:`from_env`, see :func:`traces_url`)."""
        return self.endpoint

    def resource(self) -> dict[str, Any]:
        """Resource attributes of this rank process (semconv keys), user attributes last so they can override."""
        from . import semconv as sc

        host = socket.gethostname()
        pid = os.getpid()
        attrs: dict[str, Any] = {
            sc.SERVICE_NAME: self.service_name,
            sc.HOST_NAME: host,
            sc.PROCESS_PID: pid,
            sc.SERVICE_INSTANCE_ID: f"{host}:{pid}",
            sc.CP_RANK: self.cp_rank,
            sc.TP_RANK: self.tp_rank,
            sc.DP_RANK: self.dp_rank,
            sc.RUN_ID: self.run_id,
            sc.TRACE_LEVEL: self.level,
        }
        if self.rank_source:
            attrs[sc.RANK_SOURCE] = self.rank_source
        if self.sample < 1.0:
            attrs[sc.SAMPLE] = self.sample
        for k, v in self.resource_attributes:
            attrs[k] = v
        return attrs


def parse_level(raw: str | None) -> int:
    """The gate value: an int >= 0. Empty or unset means 0; a bad value warns once and means 0."""
    if raw is None or raw.strip() == "":
        return 0
    try:
        v = int(raw.strip())
    except ValueError:
        _warn_once("level:" + raw, f"trace level {raw!r} is not an integer; tracing stays off (level 0)")
        return 0
    if v < 0:
        _warn_once("level:" + raw, f"trace level {raw!r} is negative; tracing stays off (level 0)")
        return 0
    return v


def _parse_kv_list(raw: str, what: str, secret: bool = False) -> tuple[tuple[str, str], ...]:
    out = []
    for item in raw.split(","):
        if not item.strip():
            continue
        k, eq, v = item.partition("=")
        if not eq or not k.strip():
            # A header entry may be a credential typed with the wrong separator (authorization:Bearer X): name it
            # by its first characters only.
            shown = (repr(item.strip()[:4] + "...") if len(item.strip()) > 4 else "'***'") if secret else repr(item)
            _warn_once(what + item, f"ignoring malformed {what} entry {shown} (want key=value)")
            continue
        out.append((unquote(k.strip()), unquote(v.strip())))
    return tuple(out)


def _int(env: Mapping[str, str], name: str, default: int, lo: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        v = int(raw)
        if lo is not None and v < lo:
            raise ValueError
        return v
    except ValueError:
        _warn_once(name + raw, f"{name}={raw!r} is invalid; using {default}")
        return default


MEMORY_FRACTION = 8   # the ring and the buffer's byte bound each take at most 1/8 of what the machine allows


def memory_limit() -> tuple[int, str]:
    """The memory this process may use, and where that figure comes from: the smaller of the machine's physical
    memory and the cgroup limit (v2 ``memory.max``, v1 ``memory.limit_in_bytes``) where one is set. ``(0, "")``
    when neither can be read."""
    best, why = 0, ""
    try:
        best, why = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "physical memory"
    except (ValueError, OSError, AttributeError):
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                v = int(f.read().strip())   # "max" (no limit) is not an int
        except (OSError, ValueError):
            continue
        if 0 < v < (best or v + 1):
            best, why = v, f"the cgroup memory limit ({path})"
    return best, why


def _bounded(name: str, v: int, power_of_two: bool = False) -> int:
    """``v`` bytes, or at most 1/:data:`MEMORY_FRACTION` of :func:`memory_limit` (a power of two for the ring),
    said once when it is cut: a stalled exporter must not take the traced process to the OOM killer."""
    limit, why = memory_limit()
    cap = limit // MEMORY_FRACTION
    if not cap or v <= cap:
        return v
    if power_of_two:
        cap = 1 << (cap.bit_length() - 1)
    _warn_once(f"{name}-bound-{v}", f"{name}={v} is more than 1/{MEMORY_FRACTION} of {why} ({limit} bytes); using "
               f"{cap}")
    return cap


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        v = float(raw)
        if v <= 0:
            raise ValueError
        return v
    except ValueError:
        _warn_once(name + raw, f"{name}={raw!r} is invalid; using {default}")
        return default


def _bool(raw: str | None) -> bool | None:
    if raw is None:
        return None
    v = raw.strip().lower()
    if v in ("true", "1", "yes", "on"):
        return True
    if v in ("false", "0", "no", "off", ""):
        return False
    _warn_once("bool" + raw, f"OTLP INSECURE={raw!r} is not true|false; ignoring it")
    return None


def _switch(env: Mapping[str, str], name: str, default: bool = False) -> bool:
    """An on/off variable: 1/true/yes/on is on; 0/false/no/off is off; unset or empty is ``default``; anything else
    warns once and is ``default``."""
    raw = (env.get(name) or "").strip().lower()
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    if raw:
        _warn_once("switch" + name + raw, f"{name}={raw!r} is not 1|true|yes|on|0|false|no|off; "
                   f"{'on' if default else 'off'}")
    return default


def _fraction(env: Mapping[str, str], name: str) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return 1.0
    try:
        v = float(raw)
        if not 0.0 < v <= 1.0:
            raise ValueError
        return v
    except ValueError:
        _warn_once(name + raw, f"{name}={raw!r} is not a fraction in (0, 1]; keeping every record")
        return 1.0


def _otel(env: Mapping[str, str], suffix: str) -> str | None:
    v = env.get("OTEL_EXPORTER_OTLP_TRACES_" + suffix)
    if v is None or v == "":
        v = env.get("OTEL_EXPORTER_OTLP_" + suffix)
    return v if v else None


class EndpointError(CptraceError):
    """An OTLP endpoint that is not a URL (exit 2, a usage error); the message masks its userinfo."""

    exit_code = EXIT_USAGE


def traces_url(endpoint: str, protocol: str, *, base: bool = False) -> str:
    """The one home of the ``/v1/traces`` rule: where OTLP trace requests to ``endpoint`` go.

    ``base=True`` (the generic ``OTEL_EXPORTER_OTLP_ENDPOINT``): a base URL; per the OTLP spec HTTP appends
    :data:`TRACES_PATH` to it, whatever path it has, and gRPC uses it as is (trailing ``/`` removed). Otherwise (a
    traces URL given on the command line): ``http://`` is put in front of a URL without a scheme, and for HTTP a URL
    with no path (``http://host:4318`` or ``http://host:4318/``) gets :data:`TRACES_PATH`; any other is used as
    given. The signal-specific ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is always used as is (no call here). A value
    that is no URL raises :class:`EndpointError`."""
    if base:
        endpoint = endpoint.rstrip("/")
        return endpoint + TRACES_PATH if protocol == "http/protobuf" else endpoint
    u = endpoint if "://" in endpoint else "http://" + endpoint
    try:
        path = urlsplit(u).path
    except ValueError as e:   # e.g. "Invalid IPv6 URL": the user's mistake, said without the URL's password
        raise EndpointError(f"bad OTLP endpoint {mask_url(endpoint)!r}: {e}") from None
    if protocol == "http/protobuf" and path in ("", "/"):
        u = u.rstrip("/") + TRACES_PATH
    return u


def derive_run_id(env: Mapping[str, str]) -> str:
    """A run id that every rank process of one launch on one host derives alike.

    ``CPTRACE_RUN_ID`` wins. Else ``TORCHELASTIC_RUN_ID`` (torchrun; not its placeholder ``none``; ``-r<n>`` after
    the n-th elastic restart), else a hash of the host name, the parent
    process id and the parent's start time: SGLang starts all rank processes from one launcher, so they share it.
    Ranks on several hosts have different parents: :func:`cptrace_otel.traced.ranks.agreed_run_id` replaces this id by
    one agreed through the torch.distributed store when there is one; else set ``CPTRACE_RUN_ID`` on every host.
    """
    if env.get("CPTRACE_RUN_ID"):
        return env["CPTRACE_RUN_ID"]
    if (env.get("TORCHELASTIC_RUN_ID") or "none") != "none":   # torchrun's placeholder when no id was given
        restart = env.get("TORCHELASTIC_RESTART_COUNT", "0") or "0"
        # an elastic restart keeps the id but is a new launch (new processes, new node ids)
        return "te-" + env["TORCHELASTIC_RUN_ID"] + ("" if restart == "0" else f"-r{restart}")
    ppid = os.getppid()
    start = ""
    try:
        with open(f"/proc/{ppid}/stat", "rb") as f:
            # field 22 (starttime) follows the ")" that closes the command name
            start = f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        pass
    digest = hashlib.blake2b(f"{socket.gethostname()}|{ppid}|{start}".encode(), digest_size=6).hexdigest()
    return f"auto-{digest}"


def from_env(env: Mapping[str, str] | None = None, **overrides: object) -> Config:
    """Resolve a :class:`Config` from ``env`` (default ``os.environ``) and explicit overrides."""
    env = os.environ if env is None else env
    raw_level = env.get("CPTRACE_LEVEL")
    if raw_level is None or raw_level == "":
        raw_level = env.get("SGLANG_CP_HICACHE_KV_TRACE")
    protocol = (_otel(env, "PROTOCOL") or "http/protobuf").strip().lower()
    if protocol not in ("http/protobuf", "grpc"):
        _warn_once("proto" + protocol,
                   f"OTLP protocol {protocol!r} is not supported (http/protobuf, grpc); using http/protobuf")
        protocol = "http/protobuf"
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or None
    if endpoint is None and env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        # The generic endpoint is a base URL; per the OTLP spec the signal path is appended for HTTP only.
        endpoint = traces_url(env["OTEL_EXPORTER_OTLP_ENDPOINT"], protocol, base=True)
    compression = (_otel(env, "COMPRESSION") or "gzip").strip().lower()
    if compression not in ("gzip", "none"):
        _warn_once("comp" + compression, f"OTLP compression {compression!r} is not supported; using gzip")
        compression = "gzip"
    timeout_raw = _otel(env, "TIMEOUT")
    timeout_s = 10.0
    if timeout_raw:
        try:
            timeout_s = float(timeout_raw) / 1000.0  # the OTel variable is in milliseconds
            if timeout_s <= 0:
                raise ValueError
        except ValueError:
            _warn_once("timeout" + timeout_raw, f"OTLP timeout {timeout_raw!r} is invalid; using 10000 ms")
            timeout_s = 10.0
    exporter = (env.get("CPTRACE_EXPORTER") or "process").strip().lower()
    if exporter not in ("process", "thread"):
        _warn_once("exp" + exporter, f"CPTRACE_EXPORTER={exporter!r} is not process|thread; using process")
        exporter = "process"
    values: dict[str, Any] = dict(
        level=parse_level(raw_level),
        run_id=derive_run_id(env),
        endpoint=endpoint,
        protocol=protocol,
        headers=_parse_kv_list(_otel(env, "HEADERS") or "", "OTLP header", secret=True),
        timeout_s=timeout_s,
        compression=compression,
        file=env.get("CPTRACE_FILE") or None,
        log_file=env.get("CPTRACE_LOG_FILE") or None,
        cp_rank=_int(env, "CPTRACE_CP_RANK", -1),
        tp_rank=_int(env, "CPTRACE_TP_RANK", -1),
        dp_rank=_int(env, "CPTRACE_DP_RANK", -1),
        queue_size=_int(env, "CPTRACE_QUEUE_SIZE", 262144, lo=1),
        queue_bytes=_bounded("CPTRACE_QUEUE_BYTES", _int(env, "CPTRACE_QUEUE_BYTES", 64 << 20, lo=1)),
        ring=_switch(env, "CPTRACE_RING", default=True),
        ring_bytes=_bounded("CPTRACE_RING_BYTES", _int(env, "CPTRACE_RING_BYTES", 64 << 20, lo=RING.min_bytes), True),
        certificate=_otel(env, "CERTIFICATE"),
        client_certificate=_otel(env, "CLIENT_CERTIFICATE"),
        client_key=_otel(env, "CLIENT_KEY"),
        insecure=_bool(_otel(env, "INSECURE")),
        exporter=exporter,
        spool_dir=env.get("CPTRACE_SPOOL_DIR") or "",
        spool_max_bytes=_int(env, "CPTRACE_SPOOL_MAX_BYTES", 512 << 20, lo=0),
        span_timeout_s=_float(env, "CPTRACE_SPAN_TIMEOUT_S", 1.0),
        rank_wait_s=_float(env, "CPTRACE_RANK_WAIT_S", 2.0),
        sample=_fraction(env, "CPTRACE_SAMPLE"),
        checks=(env.get("CPTRACE_CHECKS", "1").strip() not in ("0", "false", "no", "off")),
        sglang_exact=_switch(env, "CPTRACE_SGLANG_EXACT"),
        cp_mode=cp_mode_setting(env.get("CPTRACE_CP_MODE"), "CPTRACE_CP_MODE"),
        service_name=env.get("OTEL_SERVICE_NAME") or "sglang-hicache",
        resource_attributes=_parse_kv_list(env.get("OTEL_RESOURCE_ATTRIBUTES") or "", "OTEL_RESOURCE_ATTRIBUTES"),
    )
    unknown = set(overrides) - set(values)
    if unknown:
        raise TypeError(f"configure() got unknown settings: {sorted(unknown)}")
    values.update({k: v for k, v in overrides.items() if v is not None})
    values["run_id_given"] = bool(env.get("CPTRACE_RUN_ID")) or overrides.get("run_id") is not None
    if values["file"] is None and values["endpoint"] is None:
        values["file"] = DEFAULT_FILE  # the embedded default: no server needed
    if not values["spool_dir"]:
        import tempfile

        # one folder per user: a shared temp dir must not hold (or let another user plant) someone else's spool
        uid = os.getuid() if hasattr(os, "getuid") else 0
        values["spool_dir"] = os.path.join(tempfile.gettempdir(), f"cptrace-spool-{uid}")
    return Config(**values)
