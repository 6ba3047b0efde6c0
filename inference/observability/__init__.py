"""Observability of the request path: request ids, platform metrics shared in Redis (exposed
through a prometheus_client collector) and the HTTP middleware that ties them to a request."""
