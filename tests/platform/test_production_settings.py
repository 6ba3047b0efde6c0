"""Production settings: with DEBUG off a platform process refuses to start without a proper
SECRET_KEY; the HTTPS settings come from the environment."""
import json
import os
import subprocess
import sys

import pytest

from llm_platform.checks import settings_problems
from llm_platform.env import env_pair
from tests.support.processes import REPO

GOOD_KEY = "k" * 20 + "ABCDEFGHIJKLmnopqrstuvwxyz0123456789"


class _Settings:
    def __init__(self, debug: bool, key: str):
        self.DEBUG, self.SECRET_KEY = debug, key


@pytest.mark.parametrize("key", ["", "dev-insecure-change-me", "django-insecure-abc" + "x" * 40,
                                 "short-key", "a" * 64])
def test_weak_or_missing_keys_are_problems_with_debug_off(key):
    assert settings_problems(_Settings(False, key))
    assert settings_problems(_Settings(True, key)) == []


def test_a_random_key_is_fine():
    assert settings_problems(_Settings(False, GOOD_KEY)) == []


def _start(env: dict[str, str], code: str = "") -> subprocess.CompletedProcess:
    """A fresh process that sets Django up with the real settings module and `env`."""
    base = {k: v for k, v in os.environ.items()
            if k not in {"SECRET_KEY", "DEBUG", "DJANGO_SETTINGS_MODULE"}}
    script = "import django; django.setup()\n" + code
    # /dev/null: not this checkout's var/secret_key, which `make serve` may have written.
    return subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                          env={**base, "DJANGO_SETTINGS_MODULE": "llm_platform.settings",
                               "SECRET_KEY_FILE": "/dev/null", **env},
                          timeout=120)


@pytest.mark.parametrize("env", [{}, {"SECRET_KEY": "dev-insecure-change-me"},
                                 {"SECRET_KEY": "short"}, {"DEBUG": "false"}])
def test_startup_refuses_a_missing_or_default_key(env):
    result = _start(env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and "SECRET_KEY" in result.stderr


def test_startup_with_debug_on_or_a_proper_key():
    assert _start({"DEBUG": "true"}).returncode == 0
    assert _start({"SECRET_KEY": GOOD_KEY}).returncode == 0


def test_the_key_may_come_from_a_file(tmp_path):
    key_file = tmp_path / "secret_key"
    key_file.write_text(GOOD_KEY + "\n")
    result = _start({"SECRET_KEY_FILE": str(key_file)},
                    "from django.conf import settings; print(settings.SECRET_KEY)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == GOOD_KEY
    assert _start({"SECRET_KEY_FILE": str(tmp_path / "missing")}).returncode != 0


def test_https_settings_come_from_the_environment():
    show = ("from django.conf import settings as s; import json; print(json.dumps([s.SECURE_PROXY_SSL_HEADER,"
            " s.SECURE_HSTS_SECONDS, s.SECURE_HSTS_INCLUDE_SUBDOMAINS, s.SESSION_COOKIE_SECURE,"
            " s.CSRF_COOKIE_SECURE, s.CSRF_TRUSTED_ORIGINS, s.SECURE_SSL_REDIRECT,"
            " len(s.AUTH_PASSWORD_VALIDATORS)]))")
    result = _start({"SECRET_KEY": GOOD_KEY, "SECURE_PROXY_SSL_HEADER": "HTTP_X_FORWARDED_PROTO,https",
                     "SECURE_HSTS_SECONDS": "31536000", "SECURE_HSTS_INCLUDE_SUBDOMAINS": "true",
                     "SESSION_COOKIE_SECURE": "true", "SECURE_SSL_REDIRECT": "true",
                     "CSRF_TRUSTED_ORIGINS": "https://api.example.com,https://console.example.com"},
                    show)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [
        ["HTTP_X_FORWARDED_PROTO", "https"], 31536000, True, True, True,
        ["https://api.example.com", "https://console.example.com"], True, 4]


def test_env_pair(monkeypatch):
    monkeypatch.setenv("PAIR", " HTTP_X_FORWARDED_PROTO , https ")
    assert env_pair("PAIR") == ("HTTP_X_FORWARDED_PROTO", "https")
    monkeypatch.setenv("PAIR", "")
    assert env_pair("PAIR") is None
    for bad in ("only-one", "a,b,c", ",https"):
        monkeypatch.setenv("PAIR", bad)
        with pytest.raises(ValueError):
            env_pair("PAIR")


def test_hsts_header_is_sent_when_configured(settings):
    from django.test import Client

    settings.SECURE_HSTS_SECONDS = 3600
    response = Client().get("/healthz", secure=True)
    assert response["Strict-Transport-Security"].startswith("max-age=3600")
