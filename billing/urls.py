from django.urls import path

from billing.views import usage_view

urlpatterns = [path("v1/usage", usage_view)]
