from django.core.management.base import BaseCommand, CommandError

from models_registry.services import ensure_model_version, store_remote_tokenizer
from replica.weights_cache import WeightsError, is_remote


class Command(BaseCommand):
    help = "Create or update a model version: registermodel NAME --model-version N --weights URI"

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--model-version", dest="version_number", type=int, default=1)
        parser.add_argument("--weights", required=True,
                            help="a path, package:<package>/<file> for packaged weights, or "
                                 "https://... (a GGUF file; give --sha256)")
        parser.add_argument("--sha256", default="",
                            help="the SHA-256 of https:// weights (64 hex digits)")
        parser.add_argument("--tokenizer", default="weights", choices=["weights", "bytes"])
        parser.add_argument("--context-length", type=int, default=2048)
        parser.add_argument("--quantization", default="")
        parser.add_argument("--private", action="store_true", help="only granted tenants")
        parser.add_argument("--state", default="active", choices=["active", "staging", "retired"],
                            help="staging: a canary, served only through a rollout")

    def handle(self, *args, **opts):
        try:
            self._register(opts)
        except WeightsError as exc:
            raise CommandError(str(exc)) from exc

    def _register(self, opts):
        version = ensure_model_version(
            opts["name"],
            opts["version_number"],
            opts["weights"],
            tokenizer=opts["tokenizer"],
            context_length=opts["context_length"],
            quantization=opts["quantization"],
            is_public=not opts["private"],
            state=opts["state"],
            weights_sha256=opts["sha256"].lower(),
        )
        if is_remote(version.weights_uri):
            self.stdout.write(f"fetching {version.weights_uri} to read its tokenizer ...")
            store_remote_tokenizer(version, progress=_Progress(self.stdout))
            self.stdout.write("tokenizer stored in the registry (web hosts need no weights)")
        self.stdout.write(f"model version {version} ({version.weights_uri})")


class _Progress:
    """Prints every 10% (or every 100 MiB when the size is unknown)."""

    def __init__(self, out):
        self._out, self._last = out, -1

    def __call__(self, done: int, total: int | None) -> None:
        step = done * 10 // total if total else done >> 27
        if step != self._last:
            self._last = step
            size = f"/{total >> 20} MiB" if total else " MiB"
            self._out.write(f"  {done >> 20}{size}")
