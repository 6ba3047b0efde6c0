"""`python manage.py setprice MODEL --model-version N --input X --output Y [--cached-input Z]
[--from ISO-TIME]`: a new price (per million tokens) from a date on; earlier usage keeps the
price that was in effect then."""
from __future__ import annotations

from datetime import datetime, timezone

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone as dj_timezone

from billing.services import set_price
from models_registry.models import ModelVersion


class Command(BaseCommand):
    help = "Add a price per million tokens for a model version, effective from a time."

    def add_arguments(self, parser):
        parser.add_argument("model")
        parser.add_argument("--model-version", dest="version_number", type=int, default=1)
        parser.add_argument("--input", required=True, help="per million input tokens")
        parser.add_argument("--output", required=True, help="per million output tokens")
        parser.add_argument("--cached-input", default=None,
                            help="per million cached input tokens (default: the input price)")
        parser.add_argument("--from", dest="start", default=None,
                            help="ISO 8601 time (UTC if no offset); default now")

    def handle(self, *args, **opts):
        try:
            version = ModelVersion.objects.get(model__name=opts["model"],
                                               version_number=opts["version_number"])
        except ModelVersion.DoesNotExist as exc:
            raise CommandError(f"no model version {opts['model']} v{opts['version_number']}") from exc
        start = dj_timezone.now()
        if opts["start"]:
            start = datetime.fromisoformat(opts["start"])
            start = start if start.tzinfo else start.replace(tzinfo=timezone.utc)
        price = set_price(version, start, opts["input"], opts["output"], opts["cached_input"])
        self.stdout.write(f"price {price}: input {price.input_per_million}, cached "
                          f"{price.cached_input_per_million or price.input_per_million}, "
                          f"output {price.output_per_million} per million tokens")
