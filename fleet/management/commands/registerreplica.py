from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from billing.selectors import MissingPrice, require_price
from models_registry.models import ModelVersion, Replica
from models_registry.services import register_replica


class Command(BaseCommand):
    help = (
        "Register a Triton replica: registerreplica MODEL [--model-version N] --grpc HOST:PORT "
        "[--metrics HOST:PORT] [--node NAME] [--zone Z] [--state ready]"
    )

    def add_arguments(self, parser):
        parser.add_argument("model")
        parser.add_argument("--model-version", dest="version_number", type=int, default=None,
                            help="default: the newest active version")
        parser.add_argument("--grpc", required=True, help="the replica's gRPC host:port")
        parser.add_argument("--metrics", default="", help="the replica's metrics host:port")
        parser.add_argument("--node", default="")
        parser.add_argument("--zone", default="")
        parser.add_argument("--state", default=Replica.State.READY, choices=Replica.State.values)

    def handle(self, *args, model, version_number, grpc, metrics, node, zone, state, **options):
        versions = ModelVersion.objects.filter(model__name=model)
        if version_number is not None:
            versions = versions.filter(version_number=version_number)
        else:
            versions = versions.filter(state=ModelVersion.State.ACTIVE)
        model_version = versions.order_by("-version_number").first()
        if model_version is None:
            raise CommandError(f"no such model version: {model} {version_number or '(active)'}")
        if state == Replica.State.READY:
            try:
                require_price(model_version, timezone.now())  # a ready replica serves traffic
            except MissingPrice as exc:
                raise CommandError(str(exc)) from None
        replica = register_replica(
            model_version, grpc, metrics_address=metrics, node_name=node, zone=zone, state=state
        )
        self.stdout.write(f"replica {replica.pk}: {replica}")
