"""A chat template rendered in Python (chat_template.NATIVE_RENDERERS) gives the text Jinja gives
for the same messages, and leaves to Jinja what it does not take (pure logic)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from replica.engine.chat_template import (NATIVE_RENDERERS, SMOLLM2_CHATML, ChatTemplate,
                                          ChatTemplateError)

SPECIALS = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}
native = ChatTemplate(SMOLLM2_CHATML, SPECIALS)
jinja = ChatTemplate(SMOLLM2_CHATML, SPECIALS, native=False)

text = st.lists(st.sampled_from(
    ["a", " ", "\n", "{{", "}}", "{%", "<|im_end|>", "<|im_start|>", "é", "漢", "🙂", "\\", "'",
     "system", "\x00"]), max_size=12).map("".join)
role = st.one_of(st.sampled_from(["system", "user", "assistant", "tool", "developer"]), text)
message = st.fixed_dictionaries({"role": role, "content": text},
                                optional={"name": text, "tool_call_id": text})


@settings(max_examples=400, deadline=None)
@given(messages=st.lists(message, max_size=6), add_generation_prompt=st.booleans())
def test_the_native_renderer_gives_what_jinja_gives(messages, add_generation_prompt):
    assert NATIVE_RENDERERS[SMOLLM2_CHATML](messages, add_generation_prompt) is not None
    assert (native.render(messages, add_generation_prompt=add_generation_prompt)
            == jinja.render(messages, add_generation_prompt=add_generation_prompt))


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": None}],
    [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    [{"role": "user"}],
    [{"content": "hi"}],
    ["not a message"],
])
def test_messages_the_native_renderer_does_not_take_go_through_jinja(messages):
    """What Jinja does with them (render or refuse) is what the template does with them."""
    assert NATIVE_RENDERERS[SMOLLM2_CHATML](messages, True) is None
    try:
        expected = jinja.render(messages)
    except (ChatTemplateError, TypeError) as exc:
        with pytest.raises(type(exc)):
            native.render(messages)
    else:
        assert native.render(messages) == expected


def test_extra_variables_go_through_jinja():
    """`tools` and other variables are the template's business: Jinja renders them."""
    messages = [{"role": "user", "content": "hi"}]
    assert native.render(messages, tools=[]) == jinja.render(messages, tools=[])


def test_a_template_differing_by_one_character_is_rendered_by_jinja():
    other = ChatTemplate(SMOLLM2_CHATML.replace("SmolLM", "SmolLM "), SPECIALS)
    assert other._native is None
    assert "named SmolLM , trained" in other.render([{"role": "user", "content": "hi"}])
