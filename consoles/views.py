"""The live fleet page (in the admin): rows rendered here, then kept current over the
WebSocket /ws/admin/fleet without reloading."""
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse

from consoles.fleet_events import replica_rows


def fleet_page(request):
    if not request.user.has_perm("models_registry.view_replica"):
        raise PermissionDenied
    context = {**admin.site.each_context(request), "title": "Live fleet",
               "rows": replica_rows()}
    return TemplateResponse(request, "consoles/fleet.html", context)
