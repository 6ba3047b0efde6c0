"""inference/json_body.decode_json: the orjson fast path returns exactly what the thorough
path (the standard library's parser, every invariant checked) returns, for bodies it takes, and
leaves every other body to it (same value or same refusal)."""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inference.errors import ApiError
from inference.json_body import MAX_DEPTH, decode_json, decode_thoroughly

LIMIT = 1 << 20


def outcome(decode, raw: bytes):
    try:
        value = decode(raw)
    except ApiError as exc:
        return ("refused", exc.status, exc.code, exc.message)
    return ("value", json.dumps(value, sort_keys=True), repr(value))


EDGES = [
    b'{"model": "m", "messages": [{"role": "user", "content": "Hi \\u00e9\\ud83d\\ude00"}]}',
    b'{"max_tokens": 9223372036854775807}', b'{"seed": -9223372036854775808}',
    b'{"seed": 18446744073709551615}', b'{"seed": 18446744073709551616}',
    b'{"seed": -9223372036854775809}', b'{"n": 1' + b'0' * 120 + b'}',
    b'{"t": 1e400}', b'{"t": -1e309}', b'{"t": 1.5e-400}', b'{"t": NaN}', b'{"t": Infinity}',
    b'{"s": "\\ud800"}', b'{"s": "\\udfff x"}', b'"\xed\xa0\x80"', b'\xef\xbb\xbf{}',
    b'{"a": 1, "a": 2}', b'[1, 2,]', b'{"a": "x\x01"}', b'  {"a": -0}  ', b'1E2',
    b'[' * MAX_DEPTH + b']' * MAX_DEPTH, b'[' * (MAX_DEPTH + 1) + b']' * (MAX_DEPTH + 1),
    b'[' * 2000 + b']' * 2000, b'\xff', b'', b'null', b'{"\\ud800": 1}',
]


@pytest.mark.parametrize("raw", EDGES)
def test_edge_bodies_decode_as_the_thorough_path_decodes_them(raw):
    assert outcome(lambda r: decode_json(r, LIMIT), raw) == outcome(decode_thoroughly, raw)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10 ** 30), max_value=10 ** 30)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_json_value_decodes_as_the_thorough_path_decodes_it(value):
    raw = json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")
    assert outcome(lambda r: decode_json(r, LIMIT), raw) == outcome(decode_thoroughly, raw)
