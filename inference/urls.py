from django.urls import path

from inference.views.catalog import (
    healthz_view,
    model_view,
    models_view,
    readyz_view,
    web_readyz_view,
)
from inference.views.generation import chat_completions_view, completions_view, generate_view
from inference.views.metrics import metrics_view
from inference.views.openapi import openapi_view
from inference.views.usage import usage_view

urlpatterns = [
    path("v1/generate", generate_view),
    path("v1/chat/completions", chat_completions_view),
    path("v1/completions", completions_view),
    path("v1/models", models_view),
    path("v1/models/<path:model_id>", model_view),
    path("v1/openapi.json", openapi_view),
    path("health", healthz_view),
    path("healthz", healthz_view),
    path("readyz", readyz_view),
    path("readyz/web", web_readyz_view),
    path("metrics", metrics_view),
    path("v1/usage", usage_view),  # reads billing's roll-ups; a view of the API, so it lives here
]
