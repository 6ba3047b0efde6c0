"""The staff console for the fleet: nodes, replicas (state, load, lifecycle actions, their
transitions) and the autoscaler's decisions. The live view of replicas is the fleet page
(consoles); models, versions and scaling policies are in models_registry/admin.py."""
import redis
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.utils import timezone

from fleet.lifecycle import IllegalTransition, transition
from fleet.models import ReplicaTransition, ScalingDecision
from models_registry.models import Node, Replica
from common import redis_keys


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
                pipe.hget(redis_keys.outstanding_tokens(settings.REDIS_KEY_PREFIX,
                                                        replica.model_version_id),
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

