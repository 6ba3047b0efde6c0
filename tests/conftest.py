"""Session-wide cleanup of this run's Redis keys (names are private to the run: tests.settings)."""
import pytest


@pytest.fixture(scope="session", autouse=True)
def _redis_cleanup():
    yield
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
