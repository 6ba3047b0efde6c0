from django.contrib import admin

from models_registry.models import (
    Model,
    ModelVersion,
    Node,
    Replica,
    ReplicaTransition,
    ScalingDecision,
    ScalingPolicy,
)


class ModelVersionInline(admin.TabularInline):
    model = ModelVersion
    extra = 0
    fields = ("version", "state", "weights_uri", "tokenizer", "quantization", "context_length")


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
    list_display = ("model", "version", "state", "quantization", "context_length", "created_at")
    list_filter = ("state", "model")
    inlines = [ScalingPolicyInline]


@admin.register(ScalingPolicy)
class ScalingPolicyAdmin(admin.ModelAdmin):
    list_display = ("model_version", "enabled", "min_replicas", "max_replicas", "warm_pool_size",
                    "scale_to_zero", "predictive")
    list_editable = ("enabled", "min_replicas", "max_replicas", "warm_pool_size", "scale_to_zero",
                     "predictive")


@admin.register(ScalingDecision)
class ScalingDecisionAdmin(admin.ModelAdmin):
    list_display = ("at", "model_version", "action", "current_replicas", "recommended_replicas",
                    "desired_replicas", "reason")
    list_filter = ("action", "model_version")
    readonly_fields = [f.name for f in ScalingDecision._meta.fields]

    def has_add_permission(self, request):
        return False


class ReplicaTransitionInline(admin.TabularInline):
    model = ReplicaTransition
    extra = 0
    can_delete = False
    readonly_fields = ("at", "from_state", "to_state", "reason")

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ("name", "zone", "accelerator", "cpu_slots", "memory_mib", "is_schedulable",
                    "last_heartbeat", "lost_at")


@admin.register(Replica)
class ReplicaAdmin(admin.ModelAdmin):
    list_display = ("model_version", "grpc_address", "metrics_address", "state", "zone", "node",
                    "managed", "load_seconds", "last_heartbeat")
    inlines = [ReplicaTransitionInline]
    list_filter = ("state", "model_version__model")
    list_editable = ("state",)

from models_registry import rollout_admin  # noqa: E402,F401 - registers the rollout admin
