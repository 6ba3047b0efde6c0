"""Admin for canary rollouts: list, history with evidence, and the manual actions (pause,
resume, promote, roll back), each a call to rollouts.services."""
from __future__ import annotations

import json

from django.contrib import admin, messages
from django.utils.html import format_html

from rollouts.models import Rollout, RolloutStep
from rollouts import services


class RolloutStepInline(admin.TabularInline):
    model = RolloutStep
    extra = 0
    can_delete = False
    fields = ("occurred_at", "kind", "from_percent", "to_percent", "automatic", "actor", "reason",
              "evidence_json")
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False

    @admin.display(description="evidence")
    def evidence_json(self, step: RolloutStep):
        return format_html("<pre style='max-height:12em;overflow:auto'>{}</pre>",
                           json.dumps(step.evidence, indent=1, default=str))


def _action(service, verb: str):
    def run(modeladmin, request, queryset):
        for rollout in queryset:
            try:
                service(rollout, actor=request.user.get_username(), reason=f"{verb} by hand")
                modeladmin.message_user(request, f"{rollout}: {verb}")
            except services.RolloutError as exc:
                modeladmin.message_user(request, f"{rollout}: {exc}", level=messages.ERROR)

    run.short_description = f"{verb.capitalize()} selected rollouts"
    run.__name__ = f"{verb.replace(' ', '_')}_rollouts"
    return run


@admin.register(Rollout)
class RolloutAdmin(admin.ModelAdmin):
    list_display = ("model", "stable_version", "canary_version", "state", "traffic_percent",
                    "step_started_at", "last_evaluated_at", "created_at")
    list_filter = ("state", "model")
    readonly_fields = ("state", "step_index", "traffic_percent", "step_started_at",
                       "probe_step_index", "probe_result", "last_evaluated_at", "last_evidence",
                       "created_by", "finished_at")
    inlines = [RolloutStepInline]
    actions = [_action(services.pause_rollout, "pause"), _action(services.resume_rollout, "resume"),
               _action(services.promote_rollout, "promote"),
               _action(services.rollback_rollout, "roll back")]

    def has_add_permission(self, request):
        return False  # started with `manage.py startrollout` or services.start_rollout
