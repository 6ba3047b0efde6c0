import pytest
from django.contrib.auth.models import Group, User

from consoles.roles import ACCOUNT_MANAGER, OPERATOR, ensure_roles
from models_registry.services import ensure_model_version
from tenants.services import add_member, create_tenant


@pytest.fixture
def roles(transactional_db):
    return ensure_roles()


def staff(username: str, role: str) -> User:
    user = User.objects.create_user(username, f"{username}@example.com", "pw", is_staff=True)
    user.groups.add(Group.objects.get(name=role))
    return user


@pytest.fixture
def manager(roles) -> User:
    return staff("manager", ACCOUNT_MANAGER)


@pytest.fixture
def operator(roles) -> User:
    return staff("operator", OPERATOR)


@pytest.fixture
def model_version(transactional_db):
    return ensure_model_version("chat-small", 1, "fake", tokenizer="bytes", context_length=1024)


@pytest.fixture
def tenant_a(transactional_db):
    return create_tenant("acme", "interactive")


@pytest.fixture
def tenant_b(transactional_db):
    return create_tenant("globex", "standard")


@pytest.fixture
def member_a(tenant_a) -> User:
    user = User.objects.create_user("alice", "alice@example.com", "pw")
    add_member(user, tenant_a)
    return user


@pytest.fixture
def member_b(tenant_b) -> User:
    user = User.objects.create_user("bob", "bob@example.com", "pw")
    add_member(user, tenant_b)
    return user
