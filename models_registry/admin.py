"""The staff console for the registry: models, versions (state, quantisation, prices), nodes
and replicas (state, load). The live view of replicas is the fleet page (consoles)."""
import redis
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.utils import timezone

from billing.models import Price
from models_registry.lifecycle import IllegalTransition, transition
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


@admin.register(ModelVersion)
class ModelVersionAdmin(admin.ModelAdmin):
    list_display = ("model", "version", "state", "quantization", "context_length",
                    "price_now", "created_at")
    list_filter = ("state", "model")
    list_select_related = ("model",)
    inlines = [PriceInline, ScalingPolicyInline]

    @admin.display(description="price now (input / output per 1M tokens)")
    def price_now(self, version):
        from django.utils import timezone

        price = (Price.objects.filter(model_version=version, effective_from__lte=timezone.now())
                 .order_by("-effective_from").first())
        if price is None:
            return "-"
        return f"{price.input_per_million} / {price.output_per_million} {price.currency}"


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


class LoadChangeList(ChangeList):
    """Each listed replica's outstanding tokens (the router's counters), one Redis round trip."""

    def get_results(self, request):
        super().get_results(request)
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=1.0)
        try:
            pipe = client.pipeline(transaction=False)
            for replica in self.result_list:
                pipe.hget(f"{settings.REDIS_KEY_PREFIX}outstanding:{replica.model_version_id}",
                          str(replica.pk))
            values = pipe.execute()
        except redis.RedisError:
            values = [None] * len(self.result_list)
        finally:
            client.close()
        for replica, value in zip(self.result_list, values):
            replica.outstanding_tokens = int(value or 0)


@admin.register(Replica)
class ReplicaAdmin(admin.ModelAdmin):
    list_display = ("model_version", "grpc_address", "metrics_address", "state", "load",
                    "zone", "node", "managed", "load_seconds", "last_heartbeat")
    inlines = [ReplicaTransitionInline]
    list_filter = ("state", "model_version__model")
    list_select_related = ("model_version__model", "node")
    # The state changes only through the lifecycle (each change checked and recorded), never
    # by editing the field.
    readonly_fields = ("state",)
    actions = ("drain", "mark_failed", "mark_stopped")

    def _move(self, request, queryset, to_state: str, verb: str) -> None:
        moved, refused = 0, []
        for replica in queryset:
            try:
                if transition(replica.pk, to_state, f"{verb} by {request.user} in the admin",
                              timezone.now()):
                    moved += 1
            except IllegalTransition as exc:
                refused.append(str(exc))
        if moved:
            self.message_user(request, f"{moved} replica(s) {verb}.", messages.SUCCESS)
        for reason in refused:
            self.message_user(request, reason, messages.ERROR)

    @admin.action(description="Drain: no new requests; in-flight streams finish, then it stops")
    def drain(self, request, queryset):
        self._move(request, queryset, Replica.State.DRAINING, "drained")

    @admin.action(description="Mark failed (the router stops using it at once)")
    def mark_failed(self, request, queryset):
        self._move(request, queryset, Replica.State.FAILED, "marked failed")

    @admin.action(description="Mark stopped (its server is gone)")
    def mark_stopped(self, request, queryset):
        self._move(request, queryset, Replica.State.STOPPED, "marked stopped")

    def get_changelist(self, request, **kwargs):
        return LoadChangeList

    @admin.display(description="outstanding tokens")
    def load(self, replica):
        return getattr(replica, "outstanding_tokens", "-")


from models_registry import rollout_admin  # noqa: E402,F401 - registers the rollout admin
