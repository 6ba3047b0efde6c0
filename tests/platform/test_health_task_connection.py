"""The Celery health-check task survives a PostgreSQL restart: the async ORM's thread gets a
usable connection again on the next run (the chaos benchmark found every later check failing
with 'the connection is closed')."""
import pytest
from django.db import connection

from models_registry.models import Replica
from models_registry.services import register_replica
from fleet.tasks import check_replica_health
from tests.support.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def _drop_other_connections() -> int:
    """What a server restart does to every connection but this test's own. pg_terminate_backend
    only signals: wait until those backends are gone, or the next check may still find its
    connection alive and the one after it meet the cut (a race seen under load)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity "
                       "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        pids = [row[0] for row in cursor.fetchall()]
        for pid in pids:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])

    def gone() -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", [pids])
            return cursor.fetchone()[0] == 0

    wait_until(gone, 30, "exit of the terminated backends")
    return len(pids)


def test_the_health_task_reconnects_after_its_connections_were_cut(model_version):
    dead = register_replica(model_version, "127.0.0.1:1", state="ready")
    assert check_replica_health() == {dead.pk: "failed"}
    _drop_other_connections()
    # Every pooled connection was cut while idle; the pool checks one before lending it
    # (CONN_HEALTH_CHECKS), so not even the next run meets a dead one.
    Replica.objects.filter(pk=dead.pk).update(state="ready")
    assert check_replica_health() == {dead.pk: "failed"}
    assert check_replica_health() == {dead.pk: "failed"}
