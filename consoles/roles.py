"""Staff roles as Django groups. Permissions are Django's model permissions, so the admin
shows each role only what it may see and change.

- account manager: tenants, tiers, memberships and keys (create, revoke), usage, invoices and
  prices; reads models and the fleet.
- operator: models, versions, nodes, replicas (and rollouts when that model exists), the live
  fleet page; reads tenants and usage.
Staff users get a role by being put in its group (and `is_staff`); superusers have everything.
"""
from __future__ import annotations

from django.contrib.auth.models import Group, Permission

ACCOUNT_MANAGER = "account manager"
OPERATOR = "operator"

_ALL = ("add", "change", "delete", "view")
# role -> {app_label.model: actions}
ROLE_PERMISSIONS: dict[str, dict[str, tuple[str, ...]]] = {
    ACCOUNT_MANAGER: {
        "tenants.tenant": ("add", "change", "view"),
        "tenants.tier": ("add", "change", "view"),
        "tenants.apikey": ("add", "change", "view"),
        "tenants.tenantmembership": _ALL,
        "billing.usagerecord": ("view",),
        "billing.usagehourly": ("view",),
        "billing.invoice": ("view",),
        "billing.invoiceline": ("view",),
        "billing.price": ("add", "view"),
        "models_registry.model": ("view",),
        "models_registry.modelversion": ("view",),
        "models_registry.node": ("view",),
        "models_registry.replica": ("view",),
    },
    OPERATOR: {
        "models_registry.model": _ALL,
        "models_registry.modelversion": _ALL,
        "models_registry.node": _ALL,
        "models_registry.replica": _ALL,
        "rollouts.rollout": ("add", "change", "view"),
        "rollouts.rolloutstep": ("view",),
        "models_registry.scalingpolicy": _ALL,
        "fleet.scalingdecision": ("view",),
        "fleet.replicatransition": ("view",),
        "tenants.tenant": ("view",),
        "tenants.tier": ("view",),
        "billing.usagehourly": ("view",),
        "billing.price": ("view",),
    },
}


def ensure_roles() -> dict[str, Group]:
    """Create or update the role groups (idempotent). Permissions of models that do not exist
    (yet) are skipped."""
    groups = {}
    for role, models in ROLE_PERMISSIONS.items():
        group, _ = Group.objects.get_or_create(name=role)
        wanted = []
        for label, actions in models.items():
            app_label, model = label.split(".")
            codenames = [f"{action}_{model}" for action in actions]
            wanted += list(Permission.objects.filter(content_type__app_label=app_label,
                                                     content_type__model=model,
                                                     codename__in=codenames))
        group.permissions.set(wanted)
        groups[role] = group
    return groups


def ensure_roles_after_migrate(sender, app_config=None, **kwargs) -> None:
    # Permissions are created by auth's own post_migrate handler; run once, after ours is last.
    if app_config is not None and app_config.label == "consoles":
        ensure_roles()
