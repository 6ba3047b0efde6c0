"""No dead code: vulture over every package (tests, benchmarks and scripts count as users)
finds nothing but what is listed in KEPT, each with its reason. Django's and Triton's own
conventions (admin options, management commands, Meta, AppConfig hooks, gRPC servicer methods,
...) are called by the frameworks and ignored by name or decorator."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VULTURE = Path(sys.executable).with_name("vulture")
PACKAGES = ["common", "tenants", "models_registry", "billing", "inference", "fleet", "rollouts",
            "consoles", "dashboard", "replica", "llm_platform", "tests", "benchmarks", "scripts"]
FRAMEWORK_NAMES = ",".join([
    "Meta", "Command", "handle", "add_arguments", "help", "list_*", "search_fields",
    "readonly_fields", "fields", "inlines", "actions", "can_delete", "extra", "max_num",
    "has_*_permission", "get_*", "paginator", "show_full_result_count", "date_hierarchy",
    "ordering", "indexes", "constraints", "verbose_name*", "default_auto_field", "name", "label",
    "urlpatterns", "app_name", "websocket_urlpatterns", "change_form_template", "*Config",
    "*Admin", "*Inline", "ready", "connect", "disconnect", "receive*", "filter_horizontal",
    "list_editable", "model", "initial", "dependencies", "operations", "lookup_*", "__*__",
    "test_*", "pytest_*", "application", "celery_app", "initialize", "execute", "finalize",
    "auto_complete_config", "validate_*", "extra_repr", "TritonPythonModel",
    "*Middleware",  # named by dotted paths in settings.MIDDLEWARE
    # Twisted's protocol, factory and producer interfaces, daphne's checkers, llhttp's parser
    # callbacks (llm_platform/lean_http/)
    "connectionMade", "connectionLost", "startFactory", "stopFactory", "acceptableProtocols",
    "pauseProducing", "resumeProducing", "stopProducing", "check_timeouts", "handle_exception",
    "on_message_begin", "on_url", "on_header", "on_headers_complete", "on_body",
    "on_message_complete",
    # Twisted's IReactorFDSet, called by its transports (tests/platform/test_lean_http_writes.py)
    "addReader", "removeReader", "addWriter", "removeWriter",
    # asyncio's Protocol interface (benchmarks/floor_front_door.py)
    "connection_made", "data_received",
])
FRAMEWORK_DECORATORS = ",".join(["@admin.*", "@shared_task", "@pytest.*", "@*.register",
                                 "@receiver", "@*.setter", "@*.connect"])
# name -> why it stays although nothing in the repository calls it
KEPT = {
    "fleet_replicas": "channels calls it: the group message type fleet.replicas (consoles/consumers.py)",
    "SharedConnectionPool": "named by a dotted path in settings.CACHES (llm_platform/cache.py)",
    "RequestContextMiddleware": "named by a dotted path in settings.MIDDLEWARE",
    "inject_engine_fault": "the fault-injection entry point docs/engine-faults.md gives benchmarks",
    "cleanup": "an autouse fixture (tests/e2e/test_canary_rollout.py)",
    "container_cleanup": "an autouse fixture (tests/platform/conftest.py)",
    "ServerLive": "gRPC servicer method of the fake Triton server (called by grpc)",
    "ServerReady": "gRPC servicer method of the fake Triton server",
    "ModelReady": "gRPC servicer method of the fake Triton server",
    "ModelStreamInfer": "gRPC servicer method of the fake Triton server",
}
REPORT = re.compile(r"^(?P<path>\S+):\d+: unused (?P<kind>function|method|class|property) "
                    r"'(?P<name>[^']+)'")


def test_vulture_finds_only_what_is_kept_on_purpose():
    done = subprocess.run(
        [str(VULTURE), *PACKAGES, "--min-confidence", "60",
         "--exclude", "*/migrations/*,*/__pycache__/*", "--ignore-names", FRAMEWORK_NAMES,
         "--ignore-decorators", FRAMEWORK_DECORATORS],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    found = {m["name"]: m["path"] for line in done.stdout.splitlines()
             if (m := REPORT.match(line))}
    assert {name: path for name, path in found.items() if name not in KEPT} == {}
