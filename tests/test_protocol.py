"""The protocol parser and encoders, without sockets."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.errors import ErrorCode, FrameError
from app.protocol import (
    Join,
    Leave,
    Ping,
    Pong,
    Send,
    message_frame,
    message_frame_parts,
    message_id_of,
    parse_client_frame,
    typing_frame,
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('{"type":"join","room":"lobby"}', Join(type="join", room="lobby")),
        ('{"type":"leave","room":"a.b:c-d_e"}', Leave(type="leave", room="a.b:c-d_e")),
        ('{"type":"send","room":"r","text":"hi"}', Send(type="send", room="r", text="hi")),
        (
            '{"type":"send","room":"r","text":"hi","cid":"x"}',
            Send(type="send", room="r", text="hi", cid="x"),
        ),
        (
            '{"type":"send","room":"r","text":"","cid":5}',
            Send(type="send", room="r", text="", cid=5),
        ),
        ('{"type":"ping"}', Ping(type="ping")),
        ('{"type":"pong","extra":[1,2]}', Pong(type="pong")),
    ],
)
def test_valid_frames(raw: str, expected: object) -> None:
    """Valid frames parse to their model; unknown extra fields are ignored."""
    assert parse_client_frame(raw) == expected


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ("", ErrorCode.BAD_JSON),
        ("{", ErrorCode.BAD_JSON),
        ("null", ErrorCode.BAD_FRAME),
        ('"join"', ErrorCode.BAD_FRAME),
        ('{"type":null}', ErrorCode.BAD_FRAME),
        ('{"type":"JOIN","room":"r"}', ErrorCode.UNKNOWN_TYPE),
        ('{"type":"join","room":"r r"}', ErrorCode.BAD_FRAME),
        ('{"type":"join","room":"-r"}', ErrorCode.BAD_FRAME),
        ('{"type":"send","room":"r","text":"x","cid":true}', ErrorCode.BAD_FRAME),
        ('{"type":"send","room":"r","text":"x","cid":1.5}', ErrorCode.BAD_FRAME),
        ('{"type":"send","room":"r","text":"x","cid":"' + "c" * 65 + '"}', ErrorCode.BAD_FRAME),
        ('{"type":"send","room":"r","text":"x","cid":' + str(2**63) + "}", ErrorCode.BAD_FRAME),
    ],
)
def test_invalid_frames(raw: str, code: ErrorCode) -> None:
    """Invalid frames raise FrameError with the matching code and a message that says why."""
    with pytest.raises(FrameError) as info:
        parse_client_frame(raw)
    assert info.value.code is code
    assert info.value.message


def test_error_message_names_the_field() -> None:
    """The error message names the offending field, not pydantic internals."""
    with pytest.raises(FrameError) as info:
        parse_client_frame('{"type":"send","room":"r","text":7}')
    assert info.value.message.startswith("text:")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
frame_like = st.fixed_dictionaries(
    {"type": st.sampled_from(["join", "leave", "send", "ping", "pong", "x"]) | st.text()},
    optional={"room": json_values | st.text(), "text": json_values, "cid": json_values},
)


@settings(max_examples=400, deadline=None)
@given(st.text() | frame_like.map(json.dumps))
def test_any_input_yields_frame_or_frame_error(raw: str) -> None:
    """Whatever the text, the parser returns a frame or raises FrameError, nothing else."""
    try:
        frame = parse_client_frame(raw)
    except FrameError as exc:
        assert exc.code in ErrorCode
    else:
        assert frame.type in ("join", "leave", "send", "ping", "pong")


@settings(max_examples=200, deadline=None)
@given(
    room=st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9_.:\-]{0,20}\Z"),
    text=st.text(),
    mid=st.integers(0, 2**53),
)
def test_message_encoding_round_trips(room: str, text: str, mid: int) -> None:
    """A message frame decodes back to exactly what was encoded, whatever the text."""
    decoded = orjson.loads(message_frame(message_frame_parts("room", room, "u", text), mid, 123))
    assert decoded == {
        "type": "message",
        "room": room,
        "id": mid,
        "user": "u",
        "text": text,
        "ts": 123,
    }


@settings(max_examples=200, deadline=None)
@given(
    target=st.sampled_from(["room", "to"]),
    name=st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9_.\-]{0,20}\Z"),
    user=st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9_.\-]{0,20}\Z"),
    text=st.text(),
    mid=st.integers(0, 2**53),
)
def test_the_id_is_read_back_from_any_message_frame(
    target: str, name: str, user: str, text: str, mid: int
) -> None:
    """message_id_of inverts message_frame whatever the text (quotes, `,"id":` in it...),
    and other frames have no id."""
    frame = message_frame(message_frame_parts(target, name, user, text), mid, 123)
    assert message_id_of(frame) == mid
    assert message_id_of(typing_frame(name, user)) is None
