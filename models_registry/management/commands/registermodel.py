from django.core.management.base import BaseCommand

from models_registry.services import ensure_model_version


class Command(BaseCommand):
    help = "Create or update a model version: registermodel NAME --model-version N --weights URI"

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--model-version", dest="version_number", type=int, default=1)
        parser.add_argument("--weights", required=True,
                            help="a path, or package:<package>/<file> for packaged weights")
        parser.add_argument("--tokenizer", default="weights", choices=["weights", "bytes"])
        parser.add_argument("--context-length", type=int, default=2048)
        parser.add_argument("--quantization", default="")
        parser.add_argument("--private", action="store_true", help="only granted tenants")
        parser.add_argument("--state", default="active", choices=["active", "staging", "retired"],
                            help="staging: a canary, served only through a rollout")

    def handle(self, *args, **opts):
        version = ensure_model_version(
            opts["name"],
            opts["version_number"],
            opts["weights"],
            tokenizer=opts["tokenizer"],
            context_length=opts["context_length"],
            quantization=opts["quantization"],
            is_public=not opts["private"],
            state=opts["state"],
        )
        self.stdout.write(f"model version {version} ({version.weights_uri})")
