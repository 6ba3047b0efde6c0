"""daphne's listen endpoint (with its deep accept backlog) has one definition,
`scripts/serve.py:listen_endpoint`; the Python starters (make serve, the e2e tests, the chaos
benchmark) call it, and the images and manifests, which cannot, must spell out the same string."""
from __future__ import annotations

import pytest

from scripts.serve import listen_endpoint
from tests.deploy.rendering import DEPLOY

WEB_ENDPOINT = listen_endpoint("0.0.0.0", 8000)


@pytest.mark.parametrize("path", ["Dockerfile", "compose.yaml", "k8s/base/web-deployment.yaml"])
def test_deploy_files_start_daphne_on_the_shared_endpoint(path):
    text = (DEPLOY / path).read_text()
    assert f'"daphne", "-e", "{WEB_ENDPOINT}"' in text, (
        f"deploy/{path} does not start daphne on {WEB_ENDPOINT} (scripts/serve.py listen_endpoint)")


def test_the_endpoint_keeps_a_deep_accept_backlog():
    kind, *options = listen_endpoint("127.0.0.1", 1234).split(":")
    fields = dict(option.split("=", 1) for option in options)
    assert kind == "tcp" and fields["port"] == "1234" and fields["interface"] == "127.0.0.1"
    assert int(fields["backlog"]) >= 1024  # Twisted's default of 50 reset bursts of clients
