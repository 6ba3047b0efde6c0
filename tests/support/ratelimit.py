"""A client address whose django-ratelimit count starts at zero, with time left in its window.

django-ratelimit counts in fixed windows per key (offset by a hash of the key): posts that
straddle a window's end are counted in two windows, and a count left by an earlier test or run
(the same address, the same group and rate) is still there within its window. A test that
counts attempts posts from an address with no attempts yet and at least `margin_s` of its
window left."""
from __future__ import annotations

from django.test import RequestFactory
from django_ratelimit.core import get_usage


def fresh_address(rate: str, *, group: str | None = None, fn=None, path: str = "/",
                  margin_s: float = 15.0, subnet: str = "10.9.8") -> str:
    """An address in `subnet`.0/24 that `rate` (counted per "ip", POST only, in `group` or the
    group of view `fn`) has not counted yet in a window with `margin_s` left."""
    for last in range(1, 255):
        ip = f"{subnet}.{last}"
        request = RequestFactory().post(path, REMOTE_ADDR=ip)
        usage = get_usage(request, group=group, fn=fn, key="ip", rate=rate, method="POST")
        if usage["count"] == 0 and usage["time_left"] >= margin_s:
            return ip
    raise AssertionError(f"no address in {subnet}.0/24 starts a fresh {rate} window")
