"""Helpers shared by the platform's tests."""
from __future__ import annotations

import json

from django.apps import apps


def sse_events(payload: bytes) -> list[tuple[str | None, object]]:
    """Parse an SSE body into (event name, decoded data) pairs; `[DONE]` stays a string."""
    events = []
    for block in payload.decode("utf-8").split("\n\n"):
        if not block.strip():
            continue
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                data.append(line[len("data: "):])
        raw = "\n".join(data)
        events.append((name, raw if raw == "[DONE]" else json.loads(raw)))
    return events


def joined_tokens(events: list[tuple[str | None, object]]) -> list[tuple[str | None, object]]:
    """The stream with consecutive `token` events merged into one: what a stream says, whatever
    the relay's frame boundaries (tokens that arrive together leave as one event, so how many
    token events a stream has depends on timing)."""
    joined: list[tuple[str | None, object]] = []
    for name, data in events:
        if name == "token" and joined and joined[-1][0] == "token":
            joined[-1] = ("token", {**data, "text": joined[-1][1]["text"] + data["text"]})
        else:
            joined.append((name, data))
    return joined


async def close_loop_container(loop) -> None:
    container = apps.get_app_config("inference").containers.pop(loop, None)
    if container is not None:
        await container.close()
