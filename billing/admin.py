from django.contrib import admin

from billing.models import UsageRecord


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):
    list_display = ("created_at", "request_id", "tenant", "model_name", "status",
                    "input_tokens", "output_tokens", "ttft_ms", "total_ms")
    list_filter = ("status", "model_name", "tenant")
    search_fields = ("request_id",)
    readonly_fields = [f.name for f in UsageRecord._meta.fields]

    def has_add_permission(self, request):
        return False
