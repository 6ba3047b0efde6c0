"""Canary rollouts from the command line; the same services as the admin actions."""
import json

from django.core.management.base import BaseCommand, CommandError

from models_registry.models import ModelVersion
from rollouts.models import Rollout
from rollouts import services

ACTIONS = {
    "pause": services.pause_rollout,
    "resume": services.resume_rollout,
    "promote": services.promote_rollout,
    "rollback": services.rollback_rollout,
}


class Command(BaseCommand):
    help = ("rollout start MODEL --canary-version N [--steps 5,25,50,100] [thresholds] | "
            "rollout pause|resume|promote|rollback|status MODEL")

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["start", "status", *ACTIONS])
        parser.add_argument("model")
        parser.add_argument("--canary-version", type=int)
        parser.add_argument("--stable-version", type=int, help="default: the serving version")
        parser.add_argument("--steps", default="5,25,50,100", help="percent per step, ending at 100")
        parser.add_argument("--reason", default="")
        for name in services.THRESHOLD_FIELDS:
            parser.add_argument("--" + name.replace("_", "-"), type=float)

    def handle(self, *args, **opts):
        try:
            if opts["action"] == "start":
                rollout = self._start(opts)
            elif opts["action"] == "status":
                rollout = self._live_or_latest(opts["model"])
            else:
                rollout = ACTIONS[opts["action"]](self._live_or_latest(opts["model"]),
                                                  actor="cli", reason=opts["reason"])
        except (services.RolloutError, ModelVersion.DoesNotExist, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(str(rollout))
        if opts["action"] == "status" and rollout.last_evidence:
            self.stdout.write(json.dumps(rollout.last_evidence, indent=1, default=str))

    def _start(self, opts) -> Rollout:
        if opts["canary_version"] is None:
            raise CommandError("start needs --canary-version")
        canary = ModelVersion.objects.select_related("model").get(
            model__name=opts["model"], version_number=opts["canary_version"])
        stable = None
        if opts["stable_version"] is not None:
            stable = ModelVersion.objects.get(model__name=opts["model"],
                                              version_number=opts["stable_version"])
        steps = [float(s) if "." in s else int(s) for s in opts["steps"].split(",")]
        thresholds = {name: opts[name] for name in services.THRESHOLD_FIELDS
                      if opts.get(name) is not None}
        for name in ("window_s", "step_min_s", "min_requests", "probe_max_tokens"):
            if name in thresholds:
                thresholds[name] = int(thresholds[name])
        return services.start_rollout(canary, stable=stable, steps=steps, actor="cli", **thresholds)

    def _live_or_latest(self, model_name: str) -> Rollout:
        rollout = (Rollout.objects.filter(model__name=model_name, state__in=Rollout.LIVE_STATES)
                   .first() or Rollout.objects.filter(model__name=model_name).first())
        if rollout is None:
            raise CommandError(f"{model_name} has no rollout")
        return rollout
