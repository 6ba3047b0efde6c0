from channels.auth import AuthMiddlewareStack
from channels.security.websocket import AllowedHostsOriginValidator
from django.urls import path

from consoles.consumers import FleetConsumer

# Session-authenticated (the admin's cookie); the origin must be one of ALLOWED_HOSTS so
# another site cannot open the feed with a staff member's cookie.
websocket_urlpatterns = [
    path("ws/admin/fleet", AllowedHostsOriginValidator(AuthMiddlewareStack(
        FleetConsumer.as_asgi()))),
]
