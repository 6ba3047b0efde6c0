"""Session-wide cleanup of this run's Redis keys, before and after it (names are private to the
run: tests.settings), and of the processes the tests start, also when the run is interrupted."""
import io
import signal

import pytest


def pytest_configure(config):
    """SIGTERM/SIGHUP (a killed CI job, a closed terminal) end the run like Ctrl-C: pytest then
    tears every fixture down, stopping the daphne, replica and redis-server processes they
    started (scripts/children.py also stops them at exit, and the kernel if pytest dies)."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)


@pytest.hookimpl(wrapper=True)
def pytest_timeout_set_timer(item, settings):
    """pytest-timeout's own timer, its SIGALRM handler wrapped to first write the stack of every
    task of the running event loop: a hung `await` shows only as the loop's select() in the
    threads' stacks that pytest-timeout writes."""
    result = yield
    handler = signal.getsignal(signal.SIGALRM)
    if settings.method == "signal" and callable(handler):
        def with_tasks(signum, frame):
            __tracebackhide__ = True
            _dump_asyncio_tasks(item.config.get_terminal_writer())
            handler(signum, frame)

        signal.signal(signal.SIGALRM, with_tasks)
    return result


def _dump_asyncio_tasks(terminal) -> None:
    import asyncio

    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # the test was not inside an event loop
        return
    terminal.sep("+", title="asyncio tasks at the timeout, each down its chain of awaits")
    for task in asyncio.all_tasks(loop):
        text = io.StringIO()
        text.write(f"{task!r}\n")
        awaited = task.get_coro()
        while awaited is not None:  # coroutine -> what it awaits -> ... -> a future
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
            if frame is None:
                text.write(f"    awaits {awaited!r}\n")
                break
            text.write(f"  {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}\n")
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
        terminal.write(text.getvalue())


def _delete_run_keys() -> None:
    from django.conf import settings

    if not settings.REDIS_KEY_PREFIX.startswith("llmp-test-"):
        return
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        keys = list(client.scan_iter(match=settings.REDIS_KEY_PREFIX + "*", count=1000))
        if keys:
            client.delete(*keys)
    except redis.RedisError:
        pass
    finally:
        client.close()


@pytest.fixture(scope="session", autouse=True)
def _redis_cleanup():
    """Before and after the run: a run that inherits LLMP_TEST_RUN_ID (set in the shell, or by
    a process that imported tests.settings) shares its names with the runs before it, and one
    that was killed left its keys (counters, circuits, caches keyed by ids that the recreated
    test database hands out again)."""
    _delete_run_keys()
    yield
    _delete_run_keys()
