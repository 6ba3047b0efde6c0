"""GET /v1/openapi.json: the API's OpenAPI 3.1 document (no key needed)."""
from __future__ import annotations

from django.http import JsonResponse

from inference.openapi.document import build_document
from inference.views.errors import api_endpoint


@api_endpoint("GET")
async def openapi_view(request):
    return JsonResponse(build_document())
