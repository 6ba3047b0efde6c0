"""Django's settings read as plain attributes on the request path.

`django.conf.settings` is a `LazySettings`, whose reads run `LazyObject.__getattribute__` in
Python on every access (0.2-0.5 us each on the hosts of benchmarks/README.md, against about
0.05 us for a plain attribute); a cached request to the generation endpoints read it 17 times
from the platform's own modules, 15 of them before its first token. `settings` here holds
each value a caller read as an ordinary instance attribute: the first read of a name goes to
Django (and raises its AttributeError for an unknown name), later reads find it in the
instance's `__dict__` without running any Python.

A value is dropped when Django's `setting_changed` signal names it (`override_settings`,
pytest-django's `settings` fixture), so the next read takes the new one; a change of
`settings._wrapped` as a whole (`settings.configure`, never done after start) is not seen.
Values are the settings' own objects: treat them as read-only, as Django's are.
"""
from __future__ import annotations

from django.conf import settings as django_settings
from django.core.signals import setting_changed


class HotSettings:
    """`django.conf.settings`, each name read from Django once and then kept as an attribute
    (`__getattr__` runs only for names not yet held)."""

    def __getattr__(self, name: str):
        if name.startswith("__"):  # copy, pickle and friends probe dunders: not settings
            raise AttributeError(name)
        value = getattr(django_settings, name)
        self.__dict__[name] = value
        return value

    def forget(self, name: str | None = None) -> None:
        """Drop `name` (every held value when None): the next read asks Django again."""
        if name is None:
            self.__dict__.clear()
        else:
            self.__dict__.pop(name, None)


settings = HotSettings()


def _on_setting_changed(*, setting: str, **_kwargs) -> None:
    settings.forget(setting)


setting_changed.connect(_on_setting_changed, dispatch_uid="llm_platform.hot_settings")
