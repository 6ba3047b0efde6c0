"""Log-in (rate-limited per client address, CSRF-protected) and log-out (POST only)."""
from django.conf import settings
from django.contrib.auth import login, logout
from django.contrib.auth.forms import AuthenticationForm
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST
from django_ratelimit.core import is_ratelimited


@never_cache
def login_view(request):
    limited = request.method == "POST" and is_ratelimited(
        request, group="dashboard-login", key="ip", rate=settings.LOGIN_RATELIMIT,
        method="POST", increment=True)
    form = AuthenticationForm(request, data=request.POST if request.method == "POST" else None)
    if request.method == "POST" and not limited and form.is_valid():
        login(request, form.get_user())
        target = request.POST.get("next") or request.GET.get("next") or ""
        if not url_has_allowed_host_and_scheme(target, {request.get_host()},
                                               require_https=request.is_secure()):
            target = "dashboard:overview"
        return redirect(target)
    return render(request, "dashboard/login.html",
                  {"form": form, "limited": limited, "next": request.GET.get("next", "")},
                  status=429 if limited else 200)


@require_POST
def logout_view(request):
    logout(request)
    return redirect("dashboard:login")
