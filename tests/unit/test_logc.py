"""The C log-line parser ``_speedups._logreader`` gives exactly what :func:`cptrace_otel.model.logline.parse_line` gives
(tag, fields in line order, value types) on every line it accepts, and leaves every other line to the Python parser;
the log reader produces the same events, malformed reports and counts with and without it (``fill_chunk`` against
the Python loop, ``logs._file_chunks_py``).

Skipped when the extension was not built, unless ``CPTRACE_REQUIRE_SPEEDUPS=1`` (then missing it fails)."""

from __future__ import annotations

import contextlib
import io
import os
import random

import pytest
from test_logs_fastpath import LINES

from cptrace_otel.analyze.sources import logs
from cptrace_otel.model.logline import Rng, parse_line

_logc = logs.c_reader()
_REQUIRED = os.environ.get("CPTRACE_REQUIRE_SPEEDUPS") == "1"
needs_logc = pytest.mark.skipif(_logc is None and not _REQUIRED, reason="_logc not built")


def test_speedup_present_when_required():
    if _REQUIRED:
        assert _logc is not None, "CPTRACE_REQUIRE_SPEEDUPS=1 but cptrace_otel._speedups._logreader is missing"


def _typed(v):
    """A value with its exact type at every level (so 1 != 1.0 != True, and Rng != tuple)."""
    if isinstance(v, list):
        return (list, [_typed(x) for x in v])
    if isinstance(v, Rng):
        return (Rng, [_typed(x) for x in v])
    return (type(v), v)


def _typed_fields(fields: dict) -> list:
    return [(k, _typed(v)) for k, v in fields.items()]   # a list: the key order counts


# -- random lines mixing every value form logline knows --------------------------------------------------------

_WORDS = ["wt", "d2h", "new", "L12:n5", "r7", "a=b", "x==", "=", "[1,", "1,2]", "]", "(", ")", "1-9:12-20", "0-63",
          "None", "True", "(none)", "(0)", "(err:boom)", "(err:)", "(cnt)", "tensor([1,2])", "_x", "é", "ü=1",
          "日本", "\x00", "a\x1cb", "inf", "-inf", "nan", "-nan", "infinity", "1e5", "1E5", "1e-5", "1.5e+3", "-",
          "--1", "+1", "1_0", ".5", "5.", "-.5", "0.1", "-0.0", "0.0", "1.0", "1.50", "2.5", "0x10", "1-", "1e",
          "1+2", "1ee5", "- 1"]


def _int_text(rnd: random.Random) -> str:
    pick = rnd.randrange(9)
    n = rnd.randrange(0, 100000)
    return [str(n), str(-n), f"0{n}", "-0", "0", f"-0{n}", str(rnd.randrange(10**17, 10**20)),
            str(-rnd.randrange(10**25, 10**40)), "9" * rnd.choice([18, 19, 63, 64, 400])][pick]


def _rand_value(rnd: random.Random, depth: int = 0) -> str:
    pick = rnd.randrange(12)
    if pick <= 2:
        return _int_text(rnd)
    if pick == 3:
        return rnd.choice(_WORDS)
    if pick == 4:
        return rnd.choice([f"{rnd.random() * 100:.3f}", repr(rnd.random()), repr(-rnd.random() * 1e20),
                           f"{rnd.randrange(100)}.{rnd.randrange(100)}", repr(float(rnd.randrange(10**6)))])
    if pick == 5:   # rng summaries, canonical or with odd parts
        parts = [_int_text(rnd) if rnd.random() < 0.85 else rnd.choice(["1.5", "x", "", "(0)", "1,2", "nan"])
                 for _ in range(5)]
        text = "(cnt={},min={},max={},first={},last={})".format(*parts)
        if rnd.random() < 0.1:
            text = rnd.choice([text[:-1], text + ")", text.replace(",max", ",mx"), text + "x", "(" + text + ")"])
        return text
    if pick == 6:   # lists: flat ints, empty, odd items, nested, broken
        items = [_int_text(rnd) if rnd.random() < 0.85 else _rand_value(rnd, depth + 1) if depth < 2 else "1"
                 for _ in range(rnd.randrange(0, 6))]
        text = "[" + ",".join(items) + "]"
        if rnd.random() < 0.1:
            text = rnd.choice(["[]", "[,]", "[1,]", "[,1]", "[[1],[2,3]]", "[1,[2]]", "[(0),1]", "[1", "1]", "[[]]"])
        return text
    if pick == 7:
        return ""
    if pick == 8:
        return _rand_value(rnd, depth + 1) + "=" + _rand_value(rnd, depth + 1) if depth < 2 else "a=b"
    if pick == 9:
        return "".join(rnd.choice("abc019-_.:/()[],=") for _ in range(rnd.randrange(1, 8)))
    return rnd.choice(["1", "7", "-1", "12345678901234567890123", "wt", "[1,2,3]",
                       "(cnt=64,min=0,max=63,first=0,last=63)"])


_PLAIN = ["wt", "d2h", "new", "L12:n5", "r7", "a=b", "x==", "=", "[1,", "]", "(none)", "(0)", "(err:boom)", "None",
          "0-63", "1-9:12-20", "", "007", "-0", "-", "_x", "(cnt)", "(", "[", "[1"]


def _plain_value(rnd: random.Random) -> str:
    """Values the C parser is meant to take itself (odd ones included: leading zeros, sentinels, '=' inside)."""
    pick = rnd.randrange(6)
    if pick <= 1:
        return _int_text(rnd)
    if pick == 2:
        return rnd.choice(_PLAIN)
    if pick == 3:
        return "(cnt={},min={},max={},first={},last={})".format(*(str(rnd.randrange(-9, 10**6)) for _ in range(5)))
    if pick == 4:
        return "[" + ",".join(str(rnd.randrange(-99, 10**9)) for _ in range(rnd.randrange(0, 5))) + "]"
    return "".join(rnd.choice("abcxyz_:/") for _ in range(rnd.randrange(1, 8)))


def _rand_line(rnd: random.Random) -> str:
    odd = rnd.random() < 0.5   # half the lines are hostile, the other half plausible (odd values included)
    rate = 0.25 if odd else 0.0
    toks = []
    for _ in range(rnd.randrange(0, 12)):
        key = rnd.choice(["node_id", "op", "ts", "rank", "dev", "k", "hp", "x_1", "K9"])
        if rnd.random() < rate * 0.1:
            toks.append(rnd.choice(["junk", "=x", "", "==", "k"]))   # without '=' or with an empty key
        else:
            toks.append(f"{key}={_rand_value(rnd) if rnd.random() < rate * 2 else _plain_value(rnd)}")
    if rnd.random() < 0.6:
        toks.append(rnd.choice([f"ts={rnd.randrange(10**12)}", "ts=0", "ts=007", "ts=-3", "ts=", "ts=1.5"]))
    if rnd.random() < 0.2:
        toks.insert(rnd.randrange(len(toks) + 1),
                    f"rank={rnd.choice(['0', '3', '-1', '-7', 'x', '03', str(10**30), '1.0', ''])}")
    seps = [" "] * 12 + ["  ", "\t", " \t ", "\x0b", "\x0c", "\x1c", "\x1f"]
    if odd:
        seps += ["\x85", "\xa0", "\u3000"]   # whitespace to str.split() too, but not ASCII
    body = ""
    for t in toks:
        body += rnd.choice(seps) + t
    prefix = rnd.choice(["", "", "[2026-07-18 03:03:06 ATTN_CP5 TP5] ", "INFO x ", "ATTN_CP007 ", "ATTN_CP ",
                         "ATTN_CPx ATTN_CP3 ", f"ATTN_CP{'1' * 30} ", "[CPTRACE] "] +
                        (["日志 ATTN_CP2 ", "ATTN_CP\u0663 ", "[CPTRACEx] "] if odd else []))
    tag = rnd.choice(["prepare", "ack", "fwd_hash", "insert", "reset", "split", "X9_"] +
                     (["a b", "", "ba-d", "t\u00e9"] if odd else []))
    head = f"[CPTRACE {tag}]"
    if odd and rnd.random() < 0.3:
        head = rnd.choice([f"[CPTRACE  {tag}]", f"[CPTRACE\t{tag}]", f"[CPTRACE {tag}", f"[CPTRACE {tag}]x"])
    if odd and rnd.random() < 0.05:
        body = body.lstrip(" ")   # "]k=v": no space after the tag
    end = rnd.choice(["", "", "\n", "\r\n", "\r", "\n\r", " ", " \n", "\r\r\n"])
    line = prefix + head + body + end
    if odd and rnd.random() < 0.1:
        i = rnd.randrange(len(line) + 1)
        line = line[:i] + rnd.choice(["\r", "\n", "\x00", "\ufffd"]) + line[i:]
    return line


def _fuzz_lines(n: int, seed: int) -> list[str]:
    rnd = random.Random(seed)
    return [_rand_line(rnd) for _ in range(n)]


# -- parse_line ------------------------------------------------------------------------------------------------

def _check_line(line: str) -> bool:
    """C vs reference on one line; True when C accepted it."""
    try:
        ref = parse_line(line)
    except ValueError:   # e.g. an int beyond sys.get_int_max_str_digits(): C must leave it to Python
        assert _logc.parse_line(line) is None, line
        return False
    got = _logc.parse_line(line)
    if got is None:
        return False
    assert ref is not None, line
    assert got[0] == ref.prefix and got[1] == ref.tag and got[3] == ref.bad_tokens == [], line
    assert _typed_fields(got[2]) == _typed_fields(ref.fields), line
    return True


@needs_logc
def test_lines_of_the_fast_path_test():
    accepted = [line for line in LINES if _check_line(line)]
    assert len(accepted) >= 10   # the ordinary ones; broken markers and bad tokens are left to Python


@needs_logc
def test_random_lines_match_logline():
    lines = _fuzz_lines(25000, seed=7)
    accepted = sum(_check_line(line) for line in lines)
    assert accepted > len(lines) // 3, accepted   # the test exercises the C parser, not only its fallback


@needs_logc
def test_value_forms_one_by_one():
    values = _WORDS + ["", "0", "-0", "007", "-007", "1", "-1", "9" * 18, "9" * 19, "-" + "9" * 30, "1" * 4000,
                       "1" * 4400, "(cnt=1,min=2,max=3,first=4,last=5)", "(cnt=01,min=2,max=3,first=4,last=5)",
                       "(cnt=1,min=-0,max=3,first=4,last=5)", "(cnt=1,min=a,max=b,first=c,last=d)",
                       "(cnt=1,min=1.5,max=3,first=4,last=5)", "(cnt=-1,min=-2,max=-3,first=-4,last=-5)",
                       "(cnt=1,min=2,max=3,first=4,last=5,x=1)", "[]", "[0]", "[-1,2]", "[01]", "[1,,2]", "[[1]]",
                       "[1.5]", "[a]", "[" + "9" * 40 + "]", "[-0]"]
    for v in values:
        for line in (f"[CPTRACE t] k={v}", f"[CPTRACE t] k={v} ts=1", f"p [CPTRACE t] a=1 k={v}\r\n"):
            _check_line(line)
    # the common shapes are accepted, not left to Python
    assert _logc.parse_line("[CPTRACE t] a=1 b=-2 c=wt d=(cnt=1,min=2,max=3,first=4,last=5) e=[1,2] f= "
                            "g=007 h=(none) i=0-63 j=" + "9" * 30) is not None


@needs_logc
def test_duplicate_keys_keep_first_place_last_value():
    got = _logc.parse_line("[CPTRACE t] a=1 b=2 a=3 ts=4 b=x")
    assert list(got[2].items()) == [("a", 3), ("b", "x"), ("ts", 4)]


@needs_logc
def test_rng_is_the_logline_type_and_shared_values_are_immutable():
    a = _logc.parse_line("[CPTRACE t] d=(cnt=2,min=0,max=1,first=0,last=1) l=[1,2]")[2]
    b = _logc.parse_line("[CPTRACE t] d=(cnt=2,min=0,max=1,first=0,last=1) l=[1,2]")[2]
    assert type(a["d"]) is Rng and a["d"] == Rng(2, 0, 1, 0, 1)
    assert a["l"] == b["l"] and a["l"] is not b["l"]   # lists are mutable: never shared between events


# -- fill_chunk: ts, rank, seq and the lines left to Python --------------------------------------------------------

def _text_lines(data: bytes) -> list[str]:
    """The lines of a file as the reader's text layer gives them (newline="", UTF-8 with errors="replace")."""
    return list(io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="replace", newline=""))


@needs_logc
def test_fill_chunk_ts_rank_and_fallback_lines():
    data = "".join(_fuzz_lines(8000, seed=11) + [x + "\n" for x in LINES]).encode("utf-8") + b"\xe6\x97 [CPTRACE a]\r"
    lines = _text_lines(data)
    slow_lines: list[int] = []

    def slow(line, ln):
        assert lines[ln - 5] == line
        slow_lines.append(ln)
        return None

    chunk: list = []
    state: dict = {}
    assert _logc.fill_chunk(chunk, 10**9, data, 0, True, 5, 42, state, "p", slow) == (len(data), 5 + len(lines))
    by_no = {ev.line_no: ev for ev in chunk}
    assert [ev.line_no for ev in chunk] == sorted(by_no)
    for no, line in enumerate(lines, 5):
        if "[CPTRACE" not in line:
            assert no not in by_no and no not in slow_lines
            continue
        assert (no in by_no) != (no in slow_lines), line
        if no in slow_lines:
            continue
        ev, ref = by_no[no], parse_line(line)
        assert ref is not None and ev.tag == ref.tag and _typed_fields(ev.fields) == _typed_fields(ref.fields), line
        want_ts = ref.fields.get("ts")
        assert ev.ts == (want_ts if type(want_ts) is int else no) and type(ev.ts) is int
        want_r = ref.fields.get("rank")
        if type(want_r) is not int or want_r < 0:
            want_r = logs._prefix_rank(ref.prefix) if ref.prefix else None
            if want_r is None:
                want_r = 42
        assert ev.rank == want_r and type(ev.rank) is int, line
        assert (ev.src, ev.level) == ("p", 1)
    assert len(chunk) > len(lines) // 8
    for r, (nxt, _) in state.items():
        assert [ev.seq for ev in chunk if ev.rank == r] == list(range(nxt))


@needs_logc
def test_fill_chunk_stops_at_the_limit_and_at_incomplete_lines():
    data = b"noise\n[CPTRACE a] x=1\r\n[CPTRACE a] x=2\r[CPTRACEx]\n[CPTRACE a] x=3\r"
    chunk: list = []
    slow = []
    args = (0, {}, "p", lambda line, ln: slow.append((line, ln)))
    pos, no = _logc.fill_chunk(chunk, 2, data, 0, False, 1, *args)
    assert data[pos:].startswith(b"[CPTRACEx]") and no == 4 and [ev.line_no for ev in chunk] == [2, 3]
    pos, no = _logc.fill_chunk(chunk, 10, data, pos, False, no, *args)   # the last "\r" may precede a "\n"
    assert data[pos:] == b"[CPTRACE a] x=3\r" and no == 5 and slow == [("[CPTRACEx]\n", 4)]
    pos, no = _logc.fill_chunk(chunk, 10, data, pos, True, no, *args)
    assert pos == len(data) and no == 6 and [ev.fields["x"] for ev in chunk] == [1, 2, 3]


# -- the reader end to end: the same events with and without the C parser -------------------------------------------

def _ev(e) -> tuple:
    return (e.tag, e.rank, e.seq, e.ts, e.epoch, _typed_fields(e.fields), e.level, e.src, e.line_no)


def _read(paths: list[str], monkeypatch, use_c: bool, block: int):
    """What the reader gives: the merged events, and each file's raw chunks (seq and epoch before any
    renumbering, chunk boundaries) with the shared rank state; malformed reports and counts of both."""
    with monkeypatch.context() as m, contextlib.nullcontext() if use_c else logs.python_reader():
        m.setattr(logs, "_BLOCK", block)
        bad: list = []
        st = logs.LogStats()
        evs = [_ev(e) for e in logs.read_log_events(paths, bad.append, st)]
        bad2: list = []
        st2 = logs.LogStats()
        state: dict = {}
        chunks = [[[_ev(e) for e in c] for c in logs._file_chunks(logs._open(p), p, 7, bad2.append, st2, state)]
                  for p in paths]
        counts = [(s.lines, s.events, s.malformed) for s in (st, st2)]
        return evs, chunks, bad, bad2, counts, {r: (v[0], v[1].epoch, v[1].pending) for r, v in state.items()}


@needs_logc
def test_reader_gives_the_same_events_with_and_without_c(tmp_path, monkeypatch):
    rnd = random.Random(5)
    lines = []
    for line in _fuzz_lines(6000, seed=3):
        lines.append(line)
        if rnd.random() < 0.1:
            lines.append(rnd.choice(["noise\n", "\n", "\r", "ts=1 [CPTRAC x]\n"]))
    text = "".join(x if x.endswith(("\n", "\r")) else x + "\n" for x in lines)
    p = tmp_path / "cp3.log"
    p.write_bytes(text.encode("utf-8") + b"\xff\xfe bad utf-8 [CPTRACE t] a=1\n[CPTRACE reset] ts=9\r[CPTRACE t] x=1")
    want = _read([str(p)], monkeypatch, False, 1 << 18)
    assert len(want[0]) > 1000 and want[2]
    for block in (1 << 18, 1000, 7, 1):
        assert _read([str(p)], monkeypatch, True, block) == want


@needs_logc
def test_reader_one_rank_epochs_and_seq_with_and_without_c(tmp_path, monkeypatch):
    """One rank per file: the reader's seq and epoch are final (no renumbering hides a difference)."""
    lines = [x for x in _fuzz_lines(6000, seed=9) if "rank=" not in x and "ATTN_CP" not in x]
    p = tmp_path / "rank4.log"
    p.write_text("".join(x.rstrip("\r\n") + "\n" for x in lines), encoding="utf-8")
    want = _read([str(p)], monkeypatch, False, 1 << 18)
    assert {e[1] for e in want[0]} == {4} and len({e[4] for e in want[0]}) > 20
    assert _read([str(p)], monkeypatch, True, 1 << 18) == want
    assert _read([str(p)], monkeypatch, True, 700) == want


@needs_logc
def test_reader_several_files_same_with_and_without_c(tmp_path, monkeypatch):
    paths = []
    for k in range(3):   # ranks from the file name, from the position, spread over files: merge and renumber
        p = tmp_path / ["rank2.log", "a.log", "b.log"][k]
        p.write_text("".join(x.rstrip("\r\n") + "\n" for x in _fuzz_lines(1500, seed=20 + k)), encoding="utf-8")
        paths.append(str(p))
    want = _read(paths, monkeypatch, False, 1 << 18)
    assert _read(paths, monkeypatch, True, 1 << 18) == want
    assert _read(paths, monkeypatch, True, 500) == want


@needs_logc
def test_events_built_through_their_slots_equal_constructed_ones():
    """configure(..., event_slots) makes the parser write Event's slots itself; the Events must be the ones the
    constructor makes (type, every field, no instance dict), and without event_slots it calls the type."""
    from cptrace_otel._speedups.event import event_slots
    from cptrace_otel.checks.epochs import EPOCH_TAGS, EpochTracker
    from cptrace_otel.model.events import Event

    names = event_slots()
    assert names == tuple(f for f in Event.__dataclass_fields__)
    data = "".join(_fuzz_lines(500, seed=5)).encode("utf-8")

    def events() -> list:
        chunk: list = []
        _logc.fill_chunk(chunk, 10**9, data, 0, True, 1, 0, {}, "p", lambda line, ln: None)
        return chunk

    fast = events()
    assert fast and all(type(ev) is Event and not hasattr(ev, "__dict__") for ev in fast)
    rebuilt = [Event(*(getattr(ev, n) for n in names)) for ev in fast]
    assert fast == rebuilt and [repr(e) for e in fast] == [repr(e) for e in rebuilt]
    try:
        _logc.configure(Rng, Event, EpochTracker, EPOCH_TAGS)   # no event_slots: the constructor path
        assert events() == fast
        with pytest.raises(TypeError):
            _logc.configure(Rng, Event, EpochTracker, EPOCH_TAGS, ("tag",))
    finally:
        _logc.configure(Rng, Event, EpochTracker, EPOCH_TAGS, names)
