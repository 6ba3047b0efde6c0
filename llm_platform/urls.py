from django.contrib import admin
from django.conf import settings
from django.urls import include, path
from django_ratelimit.decorators import ratelimit

from consoles.views import fleet_page
from inference.views.errors import json_not_found

urlpatterns = [
    # Console login attempts per client address (django-ratelimit; 403 when exceeded).
    path("admin/login/", ratelimit(key="ip", rate=settings.LOGIN_RATELIMIT, method="POST")(
        admin.site.login)),
    path("admin/fleet/", admin.site.admin_view(fleet_page), name="admin-fleet"),
    path("admin/", admin.site.urls),
    path("dashboard/", include("dashboard.urls")),
    path("", include("inference.urls")),
]

handler404 = json_not_found
