from django.contrib import admin
from django.conf import settings
from django.urls import include, path
from django_ratelimit.decorators import ratelimit

from inference.views.errors import json_not_found

urlpatterns = [
    # Console login attempts per client address (django-ratelimit; 403 when exceeded).
    path("admin/login/", ratelimit(key="ip", rate=settings.LOGIN_RATELIMIT, method="POST")(
        admin.site.login)),
    path("admin/", admin.site.urls),
    path("", include("inference.urls")),
    path("", include("billing.urls")),
]

handler404 = json_not_found
