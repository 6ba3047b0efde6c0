"""The tenant's API keys: list, create (the key is shown once, in that response), revoke."""
import redis
from django import forms
from django.conf import settings
from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from dashboard.access import member_view
from dashboard.selectors import visible_keys
from tenants.services import create_api_key, revoke_api_key


class KeyForm(forms.Form):
    name = forms.CharField(max_length=100, required=False, label="Key name",
                           help_text="Optional: what the key is for, e.g. \"staging\".")


@member_view
def keys(request):
    form = KeyForm(request.POST or None)
    issued = None
    if request.method == "POST" and form.is_valid():
        issued = create_api_key(request.tenant, form.cleaned_data["name"])
        form = KeyForm()
    response = render(request, "dashboard/keys.html",
                      {"tenant": request.tenant, "form": form, "issued": issued,
                       "keys": visible_keys(request.tenant.pk)})
    if issued is not None:
        response["Cache-Control"] = "no-store"  # the raw key must not sit in any cache
    return response


@require_POST
@member_view
def revoke_key(request, key_id: int):
    api_key = get_object_or_404(visible_keys(request.tenant.pk), pk=key_id)
    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=1.0)
    try:
        revoke_api_key(api_key, client, settings.REDIS_KEY_PREFIX)
    finally:
        client.close()
    messages.success(request, f"Key {api_key.prefix}… revoked.")
    return redirect("dashboard:keys")
