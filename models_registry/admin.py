"""The staff console for the catalogue: models, versions (state, quantisation) and their
scaling policies. Prices are added to the version page by billing/admin.py; nodes and replicas
are in fleet/admin.py."""
from django.contrib import admin

from models_registry.models import Model, ModelVersion, ScalingPolicy


class ModelVersionInline(admin.TabularInline):
    model = ModelVersion
    extra = 0
    fields = ("version_number", "state", "weights_uri", "tokenizer", "quantization", "context_length")


@admin.register(Model)
class ModelAdmin(admin.ModelAdmin):
    list_display = ("name", "is_public", "routing_policy", "created_at")
    list_editable = ("routing_policy",)  # takes effect within REGISTRY_CACHE_TTL_SECONDS
    filter_horizontal = ("tenants",)
    inlines = [ModelVersionInline]


class ScalingPolicyInline(admin.StackedInline):
    model = ScalingPolicy
    extra = 0
    max_num = 1


@admin.register(ModelVersion)
class ModelVersionAdmin(admin.ModelAdmin):
    list_display = ("model", "version_number", "state", "quantization", "context_length", "created_at")
    list_filter = ("state", "model")
    list_select_related = ("model",)
    inlines = [ScalingPolicyInline]


@admin.register(ScalingPolicy)
class ScalingPolicyAdmin(admin.ModelAdmin):
    list_display = ("model_version", "enabled", "min_replicas", "max_replicas", "warm_pool_size",
                    "scale_to_zero", "predictive")
    list_editable = ("enabled", "min_replicas", "max_replicas", "warm_pool_size", "scale_to_zero",
                     "predictive")
