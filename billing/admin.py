"""Staff (account managers) see every tenant's usage and invoices and export them as CSV.
Nothing here edits usage or issued invoices."""
from django.contrib import admin
from django.utils import timezone

from billing.admin_paginator import EstimatedCountPaginator
from billing.csv_export import csv_response
from billing.models import Invoice, InvoiceLine, Price, UsageHourly, UsageRecord
from models_registry.admin import ModelVersionAdmin
from models_registry.models import ModelVersion

USAGE_COLUMNS = ["request_id", "tenant_id", "api_key_id", "model_name", "model_version_id",
                 "replica_id", "input_tokens", "cached_tokens", "output_tokens", "ttft_ms",
                 "total_ms", "status", "finish_reason", "endpoint", "occurred_at", "created_at",
                 "invoice_id"]
LINE_COLUMNS = ["invoice_id", "invoice__tenant__name", "invoice__period_start", "kind",
                "model_name", "num_requests", "input_tokens", "cached_tokens", "output_tokens",
                "amount"]


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(UsageRecord)
class UsageRecordAdmin(ReadOnlyAdmin):
    list_display = ("occurred_at", "request_id", "tenant", "model_name", "status",
                    "input_tokens", "cached_tokens", "output_tokens", "ttft_ms", "total_ms",
                    "invoice")
    # By version (a small table), not model_name: DISTINCT over every usage row is slow.
    # No date_hierarchy (its DISTINCT over every row is a full scan): a date filter instead.
    list_filter = ("occurred_at", "status", "model_version", "tenant")
    list_select_related = ("tenant", "invoice__tenant")
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    search_fields = ("request_id",)
    actions = ["export_csv"]

    @admin.action(description="Export selected usage as CSV")
    def export_csv(self, request, queryset):
        return csv_response("usage.csv", USAGE_COLUMNS,
                            queryset.order_by("occurred_at").values_list(*USAGE_COLUMNS)
                            .iterator(chunk_size=2000))


@admin.register(UsageHourly)
class UsageHourlyAdmin(ReadOnlyAdmin):
    list_display = ("hour", "tenant", "model_name", "num_requests", "input_tokens",
                    "cached_tokens", "output_tokens", "ttft_p50_ms", "ttft_p90_ms")
    list_filter = ("hour", "tenant", "model_version")
    list_select_related = ("tenant",)
    show_full_result_count = False
    paginator = EstimatedCountPaginator


class InvoiceLineInline(admin.TabularInline):
    model = InvoiceLine
    extra = 0
    can_delete = False
    readonly_fields = ("kind", "model_name", "num_requests", "input_tokens", "cached_tokens",
                       "output_tokens", "amount")

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Invoice)
class InvoiceAdmin(ReadOnlyAdmin):
    list_display = ("tenant", "period_start", "period_end", "issued_at", "total", "currency")
    list_filter = ("tenant",)
    list_select_related = ("tenant",)
    date_hierarchy = "period_start"
    inlines = [InvoiceLineInline]
    actions = ["export_csv"]

    @admin.action(description="Export selected invoices (one row per line) as CSV")
    def export_csv(self, request, queryset):
        lines = (InvoiceLine.objects.filter(invoice__in=queryset)
                 .order_by("invoice__period_start", "invoice_id", "kind", "model_name")
                 .values_list(*LINE_COLUMNS))
        return csv_response("invoices.csv", LINE_COLUMNS, lines.iterator(chunk_size=2000))


@admin.register(Price)
class PriceAdmin(admin.ModelAdmin):
    """Prices are added, never edited: a change is a new row with a later effective date."""

    list_display = ("model_version", "effective_from", "input_per_million",
                    "cached_input_per_million", "output_per_million", "currency")
    list_filter = ("model_version",)

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in Price._meta.fields] if obj is not None else []

    def has_delete_permission(self, request, obj=None):
        return False


class PriceInline(admin.TabularInline):
    """Prices are added in Billing > Prices (never edited); listed here for reference."""

    model = Price
    extra = 0
    can_delete = False
    fields = ("effective_from", "input_per_million", "cached_input_per_million",
              "output_per_million", "currency")
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False


# The catalogue (models_registry, a lower layer) knows nothing of prices: billing adds them to
# its version page. billing's admin module loads after models_registry's (INSTALLED_APPS order).
admin.site.unregister(ModelVersion)


@admin.register(ModelVersion)
class PricedModelVersionAdmin(ModelVersionAdmin):
    list_display = ("model", "version_number", "state", "quantization", "context_length",
                    "price_now", "created_at")
    inlines = [PriceInline, *ModelVersionAdmin.inlines]

    @admin.display(description="price now (input / output per 1M tokens)")
    def price_now(self, version):
        price = (Price.objects.filter(model_version=version, effective_from__lte=timezone.now())
                 .order_by("-effective_from").first())
        if price is None:
            return "-"
        return f"{price.input_per_million} / {price.output_per_million} {price.currency}"
