"""ASGI entry point (daphne): HTTP through Django, WebSockets through Channels."""
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llm_platform.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402  (needs apps loaded)
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from consoles.ws_routing import websocket_urlpatterns as console_ws  # noqa: E402
from inference.ws_routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": ASGIStaticFilesHandler(django_asgi_app) if settings.SERVE_STATIC
        else django_asgi_app,
        "websocket": URLRouter(websocket_urlpatterns + console_ws),
    }
)
