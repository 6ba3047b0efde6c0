"""llm_platform.hot_settings: Django's settings as plain attributes that follow every change
Django announces (override_settings, pytest-django's settings fixture)."""
from __future__ import annotations

import pytest
from django.conf import settings as django_settings
from django.test import override_settings

from llm_platform.hot_settings import HotSettings, settings


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
    before = settings.API_MAX_BODY_BYTES
    with override_settings(API_MAX_BODY_BYTES=before + 17):
        assert settings.API_MAX_BODY_BYTES == before + 17
    assert settings.API_MAX_BODY_BYTES == before


def test_the_settings_fixture_is_seen(settings):  # noqa: F811 - pytest-django's fixture
    from llm_platform.hot_settings import settings as hot
    hot.REQUEST_PREPARE_TIMEOUT_SECONDS  # held from before the change
    settings.REQUEST_PREPARE_TIMEOUT_SECONDS = 0.125
    assert hot.REQUEST_PREPARE_TIMEOUT_SECONDS == 0.125


def test_a_setting_added_by_an_override_and_removed_again():
    with override_settings(HOT_SETTINGS_TEST_ONLY=3):
        assert settings.HOT_SETTINGS_TEST_ONLY == 3
    with pytest.raises(AttributeError):
        settings.HOT_SETTINGS_TEST_ONLY


def test_forget_all_reads_django_again():
    hot = HotSettings()
    hot.DEBUG
    hot.forget()
    assert vars(hot) == {}
