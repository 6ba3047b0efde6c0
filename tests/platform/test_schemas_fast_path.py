"""inference/schemas.py: the plain-Python fast path (`plainly_valid`) gives the serializer's
result for every body it takes, and leaves every body it is not sure about (all invalid ones
among them) to the serializer, so error bodies keep DRF's wording. Hypothesis mixes valid and
junk values for every field of the three endpoints and compares parse_request with and
without the fast path."""
from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from inference import schemas
from inference.endpoints import ENDPOINTS
from inference.errors import InvalidRequest

JUNK = st.sampled_from([None, True, False, 0, -1, 1, 2, 2.5, 1e300, -0.0, "", " ", "x", "\x00",
                        "\ud800", [], {}, [""], ["a"], ["a", "b", "c", "d", "e"], 2**64,
                        -(2**64), 10**400 // 10**390, {"type": "text"}])
TEXT = st.text(max_size=6)
CONTENT = TEXT | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}),
                          max_size=2) | JUNK
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(schemas.ROLES) | JUNK, "content": CONTENT},
    optional={"refusal": st.none(), "name": st.just("n")}) | JUNK
FIELDS = {
    "model": st.sampled_from(["chat-small", " chat-small", "m" * 101, "a\tb"]) | TEXT | JUNK,
    "max_tokens": st.integers(-2, 2**63) | JUNK,
    "max_completion_tokens": st.integers(-2, 5) | JUNK,
    "temperature": st.floats(-1, 3) | st.integers(-1, 3) | JUNK,
    "top_p": st.floats(-0.5, 1.5) | JUNK,
    "seed": st.integers(-(2**64), 2**64) | JUNK,
    "stop": TEXT | st.lists(TEXT, max_size=5) | JUNK,
    "stream": st.booleans() | JUNK,
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans() | JUNK})
    | JUNK,
    "n": st.integers(0, 2) | JUNK,
    "messages": st.lists(MESSAGE, max_size=3) | JUNK,
    "prompt": TEXT | st.lists(TEXT, max_size=2) | JUNK,
    "echo": st.booleans() | JUNK,
    "user": st.just("u-1"),
}


def outcome(kind, body):
    try:
        return schemas.parse_request(kind, body)
    except InvalidRequest as error:
        return ("400", str(error), error.param)


@settings(max_examples=600, deadline=None)
# A null include_usage: the fast path once took it as false; the serializer refuses it.
@example(kind="chat", valid_core=True, body={"stream_options": {"include_usage": None}})
@given(kind=st.sampled_from(sorted(ENDPOINTS)), body=st.fixed_dictionaries(
    {}, optional=FIELDS), valid_core=st.booleans())
def test_the_fast_path_agrees_with_the_serializer(kind, body, valid_core):
    kind = ENDPOINTS[kind]
    if valid_core:  # most fuzzed bodies would miss a required field: half get them
        body.setdefault("model", "chat-small")
        body.setdefault("messages" if kind.takes_messages else "prompt",
                        [{"role": "user", "content": "Hi"}] if kind.takes_messages else "Hi")
    fast = outcome(kind, body)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(schemas, "plainly_valid", lambda kind, body: None)
        slow = outcome(kind, body)
    assert fast == slow, body


@pytest.mark.parametrize("kind, body", [
    ("chat", {"model": "chat-small", "messages": [{"role": "user", "content": "Hi"}],
              "max_tokens": 16, "temperature": 0, "stream": True,
              "stream_options": {"include_usage": True}, "user": "u-1"}),
    ("generate", {"model": "chat-small", "messages": [{"role": "user", "content": "Hi"}],
                  "max_tokens": 1, "temperature": 0.0, "stream": False}),
    ("completions", {"model": "chat-small", "prompt": ["Once"], "stop": "\n", "seed": 7}),
])
def test_a_usual_request_takes_the_fast_path(kind, body):
    assert schemas.plainly_valid(ENDPOINTS[kind], body) is not None


def test_an_endpoint_with_a_field_the_fast_path_does_not_know_takes_the_serializer():
    from dataclasses import replace

    from rest_framework import serializers

    class WithSuffix(schemas.CompletionsSerializer):
        suffix = serializers.CharField(required=False)

    kind = replace(ENDPOINTS["completions"], serializer=WithSuffix)
    assert schemas.plainly_valid(kind, {"model": "chat-small", "prompt": "Hi"}) is None
