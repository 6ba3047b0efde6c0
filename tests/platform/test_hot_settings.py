"""llm_platform.hot_settings: Django's settings as plain attributes that follow every change
Django announces (override_settings, pytest-django's settings fixture)."""
from __future__ import annotations

import pytest
from django.conf import settings as django_settings
from django.test import override_settings

from llm_platform.hot_settings import HotSettings
from llm_platform.hot_settings import settings as hot


def test_a_read_is_djangos_value_then_a_plain_attribute():
    hot = HotSettings()
    assert "REQUEST_DEADLINE_SECONDS" not in vars(hot)
    assert hot.REQUEST_DEADLINE_SECONDS == django_settings.REQUEST_DEADLINE_SECONDS
    assert vars(hot)["REQUEST_DEADLINE_SECONDS"] == django_settings.REQUEST_DEADLINE_SECONDS


def test_an_unknown_name_raises_as_django_does_and_is_not_held():
    hot = HotSettings()
    with pytest.raises(AttributeError):
        hot.NO_SUCH_SETTING_ANYWHERE
    assert "NO_SUCH_SETTING_ANYWHERE" not in vars(hot)
    with pytest.raises(AttributeError):
        hot.__deepcopy__


def test_override_settings_is_seen_while_it_holds_and_after_it_ends():
    before = hot.API_MAX_BODY_BYTES
    with override_settings(API_MAX_BODY_BYTES=before + 17):
        assert hot.API_MAX_BODY_BYTES == before + 17
    assert hot.API_MAX_BODY_BYTES == before


def test_the_settings_fixture_is_seen(settings):
    hot.REQUEST_PREPARE_TIMEOUT_SECONDS  # held from before the change
    settings.REQUEST_PREPARE_TIMEOUT_SECONDS = 0.125
    assert hot.REQUEST_PREPARE_TIMEOUT_SECONDS == 0.125


def test_a_setting_added_by_an_override_and_removed_again():
    with override_settings(HOT_SETTINGS_TEST_ONLY=3):
        assert hot.HOT_SETTINGS_TEST_ONLY == 3
    with pytest.raises(AttributeError):
        hot.HOT_SETTINGS_TEST_ONLY


def test_forget_all_reads_django_again():
    hot = HotSettings()
    hot.DEBUG
    hot.forget()
    assert vars(hot) == {}


_PLATFORM = ("inference.", "tenants.", "billing.", "common.", "models_registry.", "llm_platform.")


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_cached_generation_request_reads_no_lazy_settings_of_the_platform(
        client, auth, ready_replica, settings, monkeypatch):
    """Every settings read the platform's own code makes while serving a cached request goes
    through HotSettings (was 17 reads through LazySettings, 0.2-0.5 us each). Django's own
    handler, which this test client goes through, still reads its settings as it does."""
    import json
    import sys

    from django.conf import LazySettings
    from django.utils.functional import LazyObject

    from tests.platform.test_front_door_round_trips import body, warm

    settings.API_KEY_CACHE_SECONDS = settings.QUOTA_LIMITS_CACHE_SECONDS = 30.0
    settings.REGISTRY_CACHE_TTL_SECONDS = 30.0
    await warm(client, auth)
    reads: list[tuple[str, str]] = []
    real = LazyObject.__getattribute__

    def counted(self, name):
        if type(self) is LazySettings and name.isupper():  # type(): no proxied __class__
            module = sys._getframe(1).f_globals.get("__name__", "")
            if module.startswith(_PLATFORM):
                reads.append((module, name))
        return real(self, name)

    monkeypatch.setattr(LazyObject, "__getattribute__", counted)
    response = await client.post("/v1/generate", data=json.dumps(body(2)),
                                 content_type="application/json", headers=auth)
    monkeypatch.undo()
    assert response.status_code == 200, response.content
    assert reads == []
