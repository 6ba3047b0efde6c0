"""The staff console for tenants: tiers, tenants with live quota consumption, API keys (created
here and shown once, revoked here), dashboard memberships."""
import redis
from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path
from django.utils.html import format_html

from tenants.consumption import consumption_for
from tenants.models import ApiKey, Tenant, TenantMembership, Tier
from tenants.selectors import limits_from_tenant
from tenants.services import create_api_key, revoke_api_key


def _sync_redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=1.0)


def meter(used: float, capacity: int, percent: int, unit: str):
    return format_html(
        '<meter min="0" max="100" value="{}" style="width:4em" aria-label="{} used">{}%</meter>'
        ' <span style="white-space:nowrap">{} / {} {}</span>', percent, unit, percent,
        f"{used:,.0f}", f"{capacity:,}", unit)


@admin.register(Tier)
class TierAdmin(admin.ModelAdmin):
    list_display = ("name", "priority", "ttft_target_ms", "tpot_target_ms",
                    "requests_per_minute", "tokens_per_minute", "request_burst", "token_burst",
                    "max_queue_wait_ms")
    list_editable = ("priority", "requests_per_minute", "tokens_per_minute", "request_burst",
                     "token_burst", "max_queue_wait_ms")


class ApiKeyInline(admin.TabularInline):
    model = ApiKey
    extra = 0
    fields = ("prefix", "name", "is_internal", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("prefix", "is_internal", "created_at", "last_used_at", "revoked_at")
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False  # "Create API key" on the tenant page shows the key once


class MembershipInline(admin.TabularInline):
    model = TenantMembership
    extra = 0
    raw_id_fields = ("user",)
    verbose_name = "dashboard member"


class QuotaChangeList(ChangeList):
    """Reads every listed tenant's buckets in one Redis round trip."""

    def get_results(self, request):
        super().get_results(request)
        levels = consumption_for(self.result_list)
        for tenant in self.result_list:
            tenant.live_consumption = levels.get(tenant.pk)


class CreateKeyForm(forms.Form):
    name = forms.CharField(max_length=100, required=False, label="Key name",
                           help_text="What the key is for (shown in key lists).")


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    # Limit edits reach every platform process within settings.QUOTA_LIMITS_CACHE_SECONDS.
    list_display = ("name", "tier", "is_active", "limits", "requests_now", "tokens_now")
    list_filter = ("tier", "is_active")
    list_select_related = ("tier",)
    search_fields = ("name",)
    readonly_fields = ("live_quota",)
    inlines = [ApiKeyInline, MembershipInline]
    change_form_template = "admin/tenants/tenant/change_form.html"

    def get_changelist(self, request, **kwargs):
        return QuotaChangeList

    @admin.display(description="limits (per minute)")
    def limits(self, tenant):
        lim = limits_from_tenant(tenant)
        overridden = tenant.requests_per_minute is not None or tenant.tokens_per_minute is not None
        return format_html("{} requests, {} tokens{}", f"{lim.requests_per_minute:,}",
                           f"{lim.tokens_per_minute:,}", " (own)" if overridden else "")

    @admin.display(description="requests used now")
    def requests_now(self, tenant):
        c = getattr(tenant, "live_consumption", None)
        if c is None:
            return "n/a"
        return meter(c.requests_used, c.limits.request_burst, c.requests_percent, "requests")

    @admin.display(description="tokens used now")
    def tokens_now(self, tenant):
        c = getattr(tenant, "live_consumption", None)
        if c is None:
            return "n/a"
        return meter(c.tokens_used, c.limits.token_burst, c.tokens_percent, "tokens")

    @admin.display(description="live quota consumption")
    def live_quota(self, tenant):
        if tenant.pk is None:
            return "-"
        c = consumption_for([tenant]).get(tenant.pk)
        if c is None:
            return "Redis did not answer"
        lim = c.limits
        return format_html(
            "{}<br>{}<br><small>effective limits: {} requests/min (burst {}), {} tokens/min "
            "(burst {}), tier {}</small>",
            meter(c.requests_used, lim.request_burst, c.requests_percent, "requests"),
            meter(c.tokens_used, lim.token_burst, c.tokens_percent, "tokens"),
            lim.requests_per_minute, lim.request_burst, lim.tokens_per_minute, lim.token_burst,
            lim.tier_name)

    def get_urls(self):
        return [
            path("<int:tenant_id>/create-key/", self.admin_site.admin_view(self.create_key_view),
                 name="tenants_tenant_create_key"),
        ] + super().get_urls()

    def create_key_view(self, request, tenant_id: int):
        """Issue a key; the response is the only time it is ever shown (never stored)."""
        if not request.user.has_perm("tenants.add_apikey"):
            raise PermissionDenied
        tenant = get_object_or_404(Tenant, pk=tenant_id)
        form = CreateKeyForm(request.POST or None)
        context = {**self.admin_site.each_context(request), "opts": self.model._meta,
                   "tenant": tenant, "form": form, "title": f"Create an API key for {tenant}"}
        if request.method == "POST" and form.is_valid():
            issued = create_api_key(tenant, form.cleaned_data["name"])
            context.update(issued=issued, title=f"API key created for {tenant}")
            response = TemplateResponse(request, "admin/tenants/tenant/key_created.html",
                                        context)
            response["Cache-Control"] = "no-store"
            return response
        return TemplateResponse(request, "admin/tenants/tenant/create_key.html", context)


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("prefix", "tenant", "name", "is_internal", "created_at", "last_used_at",
                    "revoked_at")
    list_filter = ("tenant", "is_internal")
    list_select_related = ("tenant",)
    search_fields = ("prefix", "tenant__name", "name")
    readonly_fields = ("tenant", "prefix", "key_hash", "is_internal", "created_at",
                       "last_used_at", "revoked_at")
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False  # keys are created from their tenant's page (shown once)

    @admin.action(description="Revoke selected keys", permissions=["change"])
    def revoke(self, request, queryset):
        client = _sync_redis()
        try:
            num = 0
            for api_key in queryset.filter(revoked_at__isnull=True):
                revoke_api_key(api_key, client, settings.REDIS_KEY_PREFIX)
                num += 1
        finally:
            client.close()
        self.message_user(request, f"Revoked {num} key(s).", messages.SUCCESS)


@admin.register(TenantMembership)
class TenantMembershipAdmin(admin.ModelAdmin):
    list_display = ("user", "tenant", "created_at")
    list_select_related = ("user", "tenant")
    list_filter = ("tenant",)
    search_fields = ("user__username", "tenant__name")
    raw_id_fields = ("user",)
