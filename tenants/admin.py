import redis
from django.conf import settings
from django.contrib import admin

from tenants.models import ApiKey, Tenant, Tier
from tenants.services import revoke_api_key


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
    fields = ("prefix", "name", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("prefix", "created_at", "last_used_at")
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False  # keys are issued by `createapikey`, which shows the key once


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    # Limit edits reach every platform process within settings.QUOTA_LIMITS_CACHE_SECONDS.
    list_display = ("name", "tier", "is_active", "requests_per_minute", "tokens_per_minute",
                    "request_burst", "token_burst", "created_at")
    list_filter = ("tier", "is_active")
    search_fields = ("name",)
    inlines = [ApiKeyInline]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("prefix", "tenant", "name", "created_at", "last_used_at", "revoked_at")
    list_filter = ("tenant",)
    search_fields = ("prefix", "tenant__name", "name")
    readonly_fields = ("prefix", "key_hash", "created_at", "last_used_at")
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False

    @admin.action(description="Revoke selected keys")
    def revoke(self, request, queryset):
        client = redis.Redis.from_url(settings.REDIS_URL)
        try:
            for api_key in queryset:
                revoke_api_key(api_key, client, settings.REDIS_KEY_PREFIX)
        finally:
            client.close()
