"""ASGI entry point (daphne): HTTP through Django, WebSockets through Channels."""
import gc
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llm_platform.settings")
django.setup(set_prefix=False)  # what django.core.asgi.get_asgi_application does

from django.core.handlers.asgi import ASGIHandler  # noqa: E402

from llm_platform.asgi_handler import InlineSignalsASGIHandler  # noqa: E402  (needs apps loaded)

# InlineSignalsASGIHandler.handle follows Django 5.2's own (two lines changed): any other Django
# gets Django's handler unchanged rather than a method written for another version.
django_asgi_app = (InlineSignalsASGIHandler() if django.VERSION[:2] == (5, 2)
                   else ASGIHandler())

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402  (needs apps loaded)
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.urls import get_resolver  # noqa: E402

from consoles.ws_routing import websocket_urlpatterns as console_ws  # noqa: E402
from inference.views.direct import DirectGeneration  # noqa: E402
from inference.ws_routing import websocket_urlpatterns  # noqa: E402
from llm_platform import idle_gc  # noqa: E402
from llm_platform.request_heads import answer_overlong_lines, leave_bodies_to_the_app  # noqa: E402

answer_overlong_lines()  # daphne's HTTP layer: a 431, not a dropped connection
leave_bodies_to_the_app()  # no form parsing in Twisted: the app reads the body

# Django, Channels and every view module (with all they import) are loaded for good: move
# them out of the collector's view, so that a full collection under load scans only what
# requests created (it took 110-170 ms every ~30 s here before, stalling every request).
get_resolver().url_patterns  # imports every view module now rather than at the first request
gc.collect()
gc.freeze()
# Young collections between bursts rather than inside them (llm_platform/idle_gc.py).
idle_gc.install(settings.API_GC_YOUNG_THRESHOLD)

http_app = ASGIStaticFilesHandler(django_asgi_app) if settings.SERVE_STATIC else django_asgi_app
if settings.API_DIRECT_PATH:  # the generation endpoints past Django's handler (same replies)
    http_app = DirectGeneration(http_app)

application = ProtocolTypeRouter(
    {
        "http": http_app,
        "websocket": URLRouter(websocket_urlpatterns + console_ws),
    }
)
