"""tunnel/PROTOCOL.md says what tunnel/frames.py does: its frame, settings and code tables are
read here and checked against the codec's own behaviour (check_header, check_setting, a fresh
session's view of a peer that sent no SETTINGS) and the error enums."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tunnel import frames
from tunnel.errors import BadFlags, BadSettings, BadStreamId, GoAwayCode, OpenErrorCode, ResetCode
from tunnel.session_state import Session

DOC = (Path(frames.__file__).parent / "PROTOCOL.md").read_text(encoding="utf-8")


NONE = "\N{EN DASH}"  # the tables' "nothing"


def table(heading: str) -> list[list[str]]:
    """The rows (cells stripped) of the first table under ``heading``."""
    lines = DOC.split(f"\n{heading}\n", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[start:end]]
    return rows[2:]  # below the header and its rule


FRAME_TYPES = table("## 3. Frame types")
SETTINGS = table("## 5. Settings")


def test_every_frame_type_is_in_the_table_once() -> None:
    assert [(int(row[0]), row[1]) for row in FRAME_TYPES] == list(enumerate(frames.TYPE_NAMES))
    for number, name, *_ in FRAME_TYPES:
        assert getattr(frames, name) == int(number)


def _accepts(ftype: int, flags: int, stream_id: int) -> bool:
    length = {frames.OPEN_FAIL: 2, frames.GOAWAY: 8, frames.WINDOW_UPDATE: 4, frames.RESET: 4,
              frames.PING: 8, frames.PONG: 8}.get(ftype, 0)
    try:
        frames.check_header(length, ftype, flags, 0, stream_id, 1 << 20)
    except (BadStreamId, BadFlags):
        return False
    return True


@pytest.mark.parametrize("row", FRAME_TYPES, ids=[row[1] for row in FRAME_TYPES])
def test_a_frame_type_takes_the_streams_and_flags_its_row_says(row: list[str]) -> None:
    ftype, stream, flags = int(row[0]), row[2], row[3]
    on_zero, on_stream = _accepts(ftype, 0, 0), _accepts(ftype, 0, 1)
    assert (on_zero, on_stream) == {"0": (True, False), "≠0": (False, True),
                                    "any": (True, True)}[stream]
    sid = 0 if on_zero else 1
    if flags == NONE:
        assert not any(_accepts(ftype, 1 << bit, sid) for bit in range(8))
    else:
        name, value = re.fullmatch(r"([A-Z]+)=(0x[0-9a-f]+)", flags).groups()  # type: ignore[union-attr]
        assert getattr(frames, f"FLAG_{name}") == int(value, 16)
        assert _accepts(ftype, int(value, 16), sid)
        assert not any(_accepts(ftype, 1 << bit, sid) for bit in range(8)
                       if 1 << bit != int(value, 16))


def _number(text: str) -> int:
    """``16384``, ``2^31-1``."""
    power = re.fullmatch(r"2\^(\d+)(?:-(\d+))?", text)
    if power:
        return int(2 ** int(power[1]) - int(power[2] or 0))
    return int(text)


# What a session assumes of a peer that has not sent the setting: the table's default column.
PEER_VIEW = {"INITIAL_WINDOW": "peer_initial_window", "MAX_FRAME_SIZE": "peer_max_frame",
             "MAX_CONCURRENT_STREAMS": "peer_max_streams",
             "MAX_METADATA_SIZE": "peer_max_metadata", "HUB_INSTANCE": "peer_hub_instance",
             "HUB_INSTANCES": "peer_hub_instances", "AGENT_VERSION": "peer_agent_version",
             "AGENT_INSTANCE": "peer_agent_instance", "HUB_PEER": "peer_hub_peers"}


@pytest.mark.parametrize("row", SETTINGS, ids=[row[1] for row in SETTINGS])
def test_a_setting_has_the_id_default_and_range_its_row_says(row: list[str]) -> None:
    number, name, default, limits = int(row[0]), row[1].split()[0], row[2], row[3]
    assert getattr(frames, f"S_{name}") == number
    peer_view = getattr(Session(), PEER_VIEW[name])
    assert peer_view == (() if default == NONE else int(default))
    low, high = (_number(v) for v in re.match(r"(\S+) \.\. ([^ ,]+)", limits).groups())  # type: ignore[union-attr]
    frames.check_setting(number, low)
    frames.check_setting(number, high)
    if low > 0:
        with pytest.raises(BadSettings):
            frames.check_setting(number, low - 1)
    if high < 2**32 - 1:
        with pytest.raises(BadSettings):
            frames.check_setting(number, high + 1)


def test_every_setting_the_codec_knows_is_in_the_table() -> None:
    known = {name.removeprefix("S_") for name in dir(frames) if name.startswith("S_")}
    assert {row[1].split()[0] for row in SETTINGS} == known


@pytest.mark.parametrize("enum", [OpenErrorCode, ResetCode, GoAwayCode])
def test_the_codes_listed_are_the_enum(enum: type) -> None:
    listed = DOC.split(f"(`{enum.__name__}`):", 1)[1].split(".", 1)[0]
    assert {name: int(value) for value, name in re.findall(r"(\d+) ([A-Z_]+)", listed)} == {
        member.name: member.value for member in enum}  # type: ignore[attr-defined]
