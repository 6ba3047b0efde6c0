"""Give a request's database connection back to the pool before it waits or streams.

Under ASGI Django runs a request's ORM calls on that request's own thread and keeps the
connection it opened until the request ends. A request that then waits in the admission queue
or streams for seconds would hold one of the pool's few connections all that time: under a
burst the pool (DB_POOL_MAX_SIZE per process) runs dry and every request, the bursting
tenant's and everyone else's, waits DB_POOL_TIMEOUT_SECONDS for a connection, then fails with
503 database_unavailable. Closing a pooled connection returns it to the pool; a later query
borrows one again.
"""
from __future__ import annotations

from asgiref.sync import sync_to_async
from django.db import connections


def _release() -> None:
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:  # never end a transaction someone is inside
            connection.close()


async def release_db_connection() -> None:
    """Runs on the request's ORM thread (thread-sensitive), where its connection lives."""
    await sync_to_async(_release)()
