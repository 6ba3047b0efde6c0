from django.contrib import admin
from django.conf import settings
from django.urls import include, path, re_path
from django.views.generic import RedirectView
from django_ratelimit.decorators import ratelimit

from consoles.views import fleet_page
from inference.views.errors import json_not_found

urlpatterns = [
    # Console login attempts per client address (django-ratelimit; 403 when exceeded).
    path("admin/login/", ratelimit(key="ip", rate=settings.LOGIN_RATELIMIT, method="POST")(
        admin.site.login)),
    path("admin/fleet/", admin.site.admin_view(fleet_page), name="admin-fleet"),
    # Admin pages of the models that moved out of models_registry (fleet's records, rollouts):
    # old bookmarks and links land on the same page at its new address.
    re_path(r"^admin/models_registry/(?P<model>replicatransition|scalingdecision|ratesample)/(?P<rest>.*)$",
            RedirectView.as_view(url="/admin/fleet/%(model)s/%(rest)s", permanent=True,
                                 query_string=True)),
    re_path(r"^admin/models_registry/(?P<model>rollout|rolloutstep)/(?P<rest>.*)$",
            RedirectView.as_view(url="/admin/rollouts/%(model)s/%(rest)s", permanent=True,
                                 query_string=True)),
    path("admin/", admin.site.urls),
    path("dashboard/", include("dashboard.urls")),
    path("", include("inference.urls")),
]

handler404 = json_not_found
