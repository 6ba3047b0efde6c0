"""Who may see the dashboard: logged-in members of an active tenant. Every view finds the
tenant from the member's session, never from the URL, and looks objects up within it (another
tenant's id is a 404, the same as an id that does not exist)."""
from __future__ import annotations

import functools

from django.contrib.auth.views import redirect_to_login
from django.shortcuts import render

from tenants.models import TenantMembership


def membership_of(user) -> TenantMembership | None:
    if not user.is_authenticated or not user.is_active:
        return None
    return (TenantMembership.objects.select_related("tenant__tier")
            .filter(user=user, tenant__is_active=True).first())


def member_view(view):
    @functools.wraps(view)
    def wrapper(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        membership = membership_of(request.user)
        if membership is None:
            return render(request, "dashboard/not_member.html", status=403)
        request.tenant = membership.tenant
        return view(request, *args, **kwargs)

    return wrapper
