from django.contrib import admin

from models_registry.models import Model, ModelVersion, Node, Replica


class ModelVersionInline(admin.TabularInline):
    model = ModelVersion
    extra = 0
    fields = ("version", "state", "weights_uri", "tokenizer", "quantization", "context_length")


@admin.register(Model)
class ModelAdmin(admin.ModelAdmin):
    list_display = ("name", "is_public", "routing_policy", "created_at")
    filter_horizontal = ("tenants",)
    inlines = [ModelVersionInline]


@admin.register(ModelVersion)
class ModelVersionAdmin(admin.ModelAdmin):
    list_display = ("model", "version", "state", "quantization", "context_length", "created_at")
    list_filter = ("state", "model")


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ("name", "zone", "accelerator", "is_schedulable", "last_heartbeat")


@admin.register(Replica)
class ReplicaAdmin(admin.ModelAdmin):
    list_display = ("model_version", "grpc_address", "metrics_address", "state", "zone", "node",
                    "last_heartbeat")
    list_filter = ("state", "model_version__model")
    list_editable = ("state",)

from models_registry import rollout_admin  # noqa: E402,F401 - registers the rollout admin
