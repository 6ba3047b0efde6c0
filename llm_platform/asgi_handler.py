"""Django's ASGI handler without a thread per request when the request needs none.

Django's `ASGIHandler` enters a `ThreadSensitiveContext` per request, sends `request_started`
with `Signal.asend` (its sync receivers through `sync_to_async`) and closes the response with
`sync_to_async(response.close)` (which sends `request_finished`). The first of those hops
creates the request's own single-thread executor, i.e. starts a thread, and leaving the context
starts another one to join it: two thread starts and two round trips to a thread per request,
about a tenth of the API process's CPU for a short request (profile in benchmarks/README.md,
"gateway"), for receivers that have nothing to do.

Django's receivers of those signals (`reset_queries`, `close_old_connections`, `close_caches`,
`reset_urlconf`) act on the calling thread's database connections and on the context's caches
(the Redis cache's `close` does nothing) and URLconf override. A request's thread does not exist yet when it starts, and the
event loop's thread never holds a database connection (the ORM refuses to run there), so:

- `request_started` runs inline when its receivers are only Django's;
- `request_finished` (`response.close()`) runs inline when the request never needed its
  thread (the hot path: key, limits and model come from caches); when it did (a database
  query, a browser page's session), it runs on that thread as Django does, so a connection
  opened there is closed there.

Any other receiver (a library's or a test's) brings back Django's own way for that signal.
`handle` is Django 5.2's (requirements/web.txt pins it) with those two lines changed.
"""
from __future__ import annotations

import asyncio

from asgiref.sync import SyncToAsync, sync_to_async
from django.core import signals
from django.core.cache import close_caches
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.base import reset_urlconf
from django.db import close_old_connections, reset_queries
from django.urls import set_script_prefix

_DJANGOS_OWN = frozenset({reset_queries, close_old_connections, close_caches, reset_urlconf})


def only_djangos(signal) -> bool:
    """Whether only Django's own receivers listen to `signal` (also read by
    inference/views/direct.py)."""
    sync_receivers, async_receivers = signal._live_receivers(None)
    return not async_receivers and all(r in _DJANGOS_OWN for r in sync_receivers)


def _request_thread_started() -> bool:
    """Whether this request's ThreadSensitiveContext has created its thread (executor)."""
    context = SyncToAsync.thread_sensitive_context.get(None)
    return context is None or context in SyncToAsync.context_to_thread_executor


class InlineSignalsASGIHandler(ASGIHandler):
    async def handle(self, scope, receive, send):
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        if only_djangos(signals.request_started):  # changed: inline, no thread
            signals.request_started.send(sender=self.__class__, scope=scope)
        else:
            await signals.request_started.asend(sender=self.__class__, scope=scope)
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            body_file.close()
            await self.send_response(error_response, send)
            await sync_to_async(error_response.close)()
            return

        async def process_request(request, send):
            response = await self.run_get_response(request)
            try:
                await self.send_response(response, send)
            except asyncio.CancelledError:
                pass
            return response

        tasks = [
            asyncio.create_task(self.listen_for_disconnect(receive)),
            asyncio.create_task(process_request(request, send)),
        ]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task.done():
                try:
                    task.result()
                except RequestAborted:
                    pass
                except AssertionError:
                    body_file.close()
                    raise
            else:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass

        try:
            response = tasks[1].result()
        except asyncio.CancelledError:
            await signals.request_finished.asend(sender=self.__class__)
        else:
            # changed: inline when the request never needed its thread
            if not _request_thread_started() and only_djangos(signals.request_finished):
                response.close()
            else:
                await sync_to_async(response.close)()

        body_file.close()
