"""GET /v1/usage?start=&end=&granularity=hour|day: the authenticated tenant's own usage."""
from __future__ import annotations

from datetime import date, datetime, time, timedelta, timezone

from asgiref.sync import sync_to_async
from django.http import JsonResponse

from billing.selectors import GRANULARITIES, usage_series
from inference.container import current_container
from inference.errors import InvalidRequest
from inference.views.errors import api_endpoint

MAX_SPAN = timedelta(days=366)
# Times outside these years are refused (400): near datetime's own limits the conversion to UTC
# and the bucket arithmetic overflow (a 500 before).
EARLIEST = datetime(1970, 1, 1, tzinfo=timezone.utc)
LATEST = datetime(9000, 1, 1, tzinfo=timezone.utc)


def _parse_time(name: str, raw: str | None) -> datetime:
    if not raw:
        raise InvalidRequest(f"'{name}' is required (ISO 8601 date or time).", param=name)
    try:
        if len(raw) == 10:
            return datetime.combine(date.fromisoformat(raw), time(0), tzinfo=timezone.utc)
        parsed = datetime.fromisoformat(raw.replace("Z", "+00:00"))
        parsed = (parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)
                  ).astimezone(timezone.utc)
    except (ValueError, OverflowError) as exc:
        raise InvalidRequest(f"'{name}' is not an ISO 8601 date or time.", param=name) from exc
    if not EARLIEST <= parsed < LATEST:
        raise InvalidRequest(f"'{name}' must fall between {EARLIEST.year} and {LATEST.year}.",
                             param=name)
    return parsed


@api_endpoint("GET")
async def usage_view(request):
    principal = await current_container().preparation.authenticate(
        request.headers.get("Authorization"))
    start = _parse_time("start", request.GET.get("start"))
    end = _parse_time("end", request.GET.get("end"))
    granularity = request.GET.get("granularity", "hour")
    if granularity not in GRANULARITIES:
        raise InvalidRequest("'granularity' must be 'hour' or 'day'.", param="granularity")
    if end <= start or end - start > MAX_SPAN:
        raise InvalidRequest("'end' must be after 'start', at most 366 days later.",
                             param="end")
    data = await sync_to_async(usage_series)(principal.tenant_id, start, end, granularity)
    return JsonResponse({"object": "list", "granularity": granularity,
                         "start": start.isoformat(), "end": end.isoformat(), "data": data})
