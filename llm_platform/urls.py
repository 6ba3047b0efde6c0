from django.contrib import admin
from django.urls import include, path

from inference.views.errors import json_not_found

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("inference.urls")),
    path("", include("billing.urls")),
]

handler404 = json_not_found
