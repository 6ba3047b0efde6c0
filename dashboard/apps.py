from django.apps import AppConfig


class DashboardConfig(AppConfig):
    """The tenant's self-serve dashboard: usage, quotas, keys, invoices, playground."""

    name = "dashboard"
