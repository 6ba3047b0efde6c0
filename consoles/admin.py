"""The rollout page in the staff console: the evaluator's evidence laid out, and buttons that
pause, resume, promote or roll back (each a POST calling rollouts.services).

Extends rollouts.admin.RolloutAdmin (re-registered here; this app comes later in
INSTALLED_APPS), so its list, history with each step's evidence and bulk actions stay."""
from __future__ import annotations

import json

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from django.views.decorators.http import require_POST

from rollouts.admin import RolloutAdmin
from rollouts.models import Rollout
from rollouts import services

# verb in the URL -> (service, label, states it applies to)
ACTIONS = {
    "pause": (services.pause_rollout, "Pause", (Rollout.State.RUNNING,)),
    "resume": (services.resume_rollout, "Resume", (Rollout.State.PAUSED,)),
    "promote": (services.promote_rollout, "Promote", Rollout.LIVE_STATES),
    "rollback": (services.rollback_rollout, "Roll back", Rollout.LIVE_STATES),
}


def evidence_table(evidence: dict):
    """The evaluator's evidence as a definition list (nested values as JSON)."""
    if not evidence:
        return "-"
    rows = ((key, value if isinstance(value, (str, int, float)) or value is None
             else json.dumps(value, default=str)) for key, value in sorted(evidence.items()))
    return format_html('<dl class="evidence">{}</dl>',
                       format_html_join("", "<dt>{}</dt><dd>{}</dd>", rows))


class ConsoleRolloutAdmin(RolloutAdmin):
    change_form_template = "admin/rollouts/rollout/change_form.html"
    exclude = ("last_evidence",)  # shown laid out as `evidence`

    def get_readonly_fields(self, request, obj=None):
        fields = [f for f in super().get_readonly_fields(request, obj) if f != "last_evidence"]
        return [*fields, "evidence"]

    @admin.display(description="last evidence")
    def evidence(self, rollout: Rollout):
        return evidence_table(rollout.last_evidence)

    def get_urls(self):
        return [path("<int:rollout_id>/act/<str:verb>/",
                     self.admin_site.admin_view(require_POST(self.act_view)),
                     name="rollouts_rollout_act")] + super().get_urls()

    def change_view(self, request, object_id, form_url="", extra_context=None):
        rollout = self.get_object(request, object_id)
        buttons = []
        if rollout is not None and self.has_change_permission(request, rollout):
            buttons = [{"verb": verb, "label": label}
                       for verb, (_, label, states) in ACTIONS.items() if rollout.state in states]
        return super().change_view(request, object_id, form_url,
                                   {**(extra_context or {}), "rollout_buttons": buttons})

    def act_view(self, request, rollout_id: int, verb: str):
        rollout = get_object_or_404(Rollout, pk=rollout_id)
        if verb not in ACTIONS:
            raise PermissionDenied  # no such action
        if not self.has_change_permission(request, rollout):
            raise PermissionDenied
        service, label, _ = ACTIONS[verb]
        try:
            service(rollout, actor=request.user.get_username(),
                    reason=f"{label.lower()} from the console")
            self.message_user(request, f"{rollout.model.name}: {label.lower()} done.",
                              messages.SUCCESS)
        except services.RolloutError as exc:
            self.message_user(request, f"{rollout.model.name}: {exc}", messages.ERROR)
        return redirect(reverse("admin:rollouts_rollout_change", args=[rollout.pk]))


admin.site.unregister(Rollout)
admin.site.register(Rollout, ConsoleRolloutAdmin)
