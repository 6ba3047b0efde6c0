from django.urls import path

from inference.consumers import StreamConsumer

websocket_urlpatterns = [path("v1/stream", StreamConsumer.as_asgi())]
