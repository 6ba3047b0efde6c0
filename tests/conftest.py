"""Session-wide cleanup of this run's Redis keys, before and after it (names are private to the
run: tests.settings), and of the processes the tests start, also when the run is interrupted."""
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
