"""Manual actions and their rules (what the admin and the consoles call)."""
import pytest
from django.contrib.auth.models import User
from django.test import Client

from models_registry.models import ModelVersion
from rollouts.models import Rollout
from rollouts import services
from rollouts.services import RolloutError
from models_registry.services import ensure_model_version
from tests.support.billing import priced


def test_start_stages_the_canary_and_records_it(versions, clock):
    stable, canary = versions
    ModelVersion.objects.filter(pk=canary.pk).update(state="active")
    rollout = services.start_rollout(canary, now=clock(), actor="am")
    assert rollout.stable_version == stable  # the serving version by default
    assert ModelVersion.objects.get(pk=canary.pk).state == "staging"
    assert (rollout.state, rollout.traffic_percent, rollout.steps) == ("running", 5.0, [5, 25, 50, 100])
    step = rollout.history.get()
    assert (step.kind, step.to_percent, step.actor, step.automatic) == ("start", 5.0, "am", False)


@pytest.mark.parametrize("steps", [[], [50, 25, 100], [10, 50], [0, 100], [100], ["5", 100]])
def test_bad_steps_are_refused(versions, steps):
    with pytest.raises(RolloutError):
        services.start_rollout(versions[1], steps=steps)


def test_one_live_rollout_per_model(versions):
    services.start_rollout(versions[1])
    third = priced(ensure_model_version("chat-small", 3, "fake-3", tokenizer="bytes",
                                        state="staging"))
    with pytest.raises(RolloutError, match="already has a live rollout"):
        services.start_rollout(third, stable=versions[0])


def test_canary_must_be_another_version_of_the_same_model(versions):
    other = priced(ensure_model_version("other", 1, "fake", tokenizer="bytes"))
    with pytest.raises(RolloutError, match="same model"):
        services.start_rollout(other, stable=versions[0])
    with pytest.raises(RolloutError, match="another version"):
        services.start_rollout(versions[0], stable=versions[0])
    with pytest.raises(RolloutError, match="unknown thresholds"):
        services.start_rollout(versions[1], max_error=0.5)


def test_pause_resume_promote(versions, clock):
    stable, canary = versions
    rollout = services.start_rollout(canary, now=clock())
    services.pause_rollout(rollout, actor="am", reason="customer complaint", now=clock())
    with pytest.raises(RolloutError, match="cannot pause a rollout that is paused"):
        services.pause_rollout(rollout)
    clock.advance(100)
    resumed = services.resume_rollout(rollout, actor="am", now=clock())
    assert resumed.state == "running" and resumed.step_started_at == clock()
    promoted = services.promote_rollout(rollout, actor="am", now=clock())
    assert (promoted.state, promoted.traffic_percent) == ("promoted", 100.0)
    assert ModelVersion.objects.get(pk=canary.pk).state == "active"
    assert ModelVersion.objects.get(pk=stable.pk).state == "retired"
    with pytest.raises(RolloutError, match="cannot roll back a rollout that is promoted"):
        services.rollback_rollout(rollout)
    kinds = list(Rollout.objects.get(pk=rollout.pk).history.values_list("kind", "actor"))
    assert kinds == [("start", ""), ("pause", "am"), ("resume", "am"), ("promote", "am")]


def test_rollback_by_hand_from_paused(versions):
    stable, canary = versions
    rollout = services.start_rollout(canary)
    services.pause_rollout(rollout)
    rolled = services.rollback_rollout(rollout, actor="am")
    assert (rolled.state, rolled.traffic_percent) == ("rolled_back", 0.0)
    assert ModelVersion.objects.get(pk=canary.pk).state == "retired"
    assert ModelVersion.objects.get(pk=stable.pk).state == "active"
    # A new rollout of the same canary is allowed once the last one ended.
    again = services.start_rollout(ModelVersion.objects.get(pk=canary.pk))
    assert again.state == "running"


def test_admin_actions(versions):
    rollout = services.start_rollout(versions[1])
    User.objects.create_superuser("boss", "b@example.com", "pw")
    client = Client()
    client.force_login(User.objects.get(username="boss"))
    url = "/admin/rollouts/rollout/"
    assert client.get(url).status_code == 200
    assert client.get(f"{url}{rollout.pk}/change/").status_code == 200
    response = client.post(url, {"action": "pause_rollouts", "_selected_action": [rollout.pk]})
    assert response.status_code == 302
    assert Rollout.objects.get(pk=rollout.pk).state == "paused"
    client.post(url, {"action": "roll_back_rollouts", "_selected_action": [rollout.pk]})
    r = Rollout.objects.get(pk=rollout.pk)
    assert r.state == "rolled_back" and r.history.last().actor == "boss"
    # Not applicable: reported, not raised.
    response = client.post(url, {"action": "pause_rollouts", "_selected_action": [rollout.pk]},
                           follow=True)
    assert "cannot pause a rollout that is rolled_back" in response.content.decode()


def test_admin_addresses_from_before_the_move_redirect(versions):
    """Rollouts lived in models_registry; bookmarks of their admin pages still arrive."""
    rollout = services.start_rollout(versions[1])
    User.objects.create_superuser("boss", "b@example.com", "pw")
    client = Client()
    client.force_login(User.objects.get(username="boss"))
    old = client.get(f"/admin/models_registry/rollout/{rollout.pk}/change/?x=1")
    assert old.status_code == 301
    assert old["Location"] == f"/admin/rollouts/rollout/{rollout.pk}/change/?x=1"
    assert client.get(old["Location"]).status_code == 200
    moved = client.get("/admin/models_registry/scalingdecision/")
    assert moved["Location"] == "/admin/fleet/scalingdecision/"
    assert client.get(moved["Location"]).status_code == 200


def test_command(versions, capsys):
    from django.core.management import call_command

    call_command("rollout", "start", "chat-small", "--canary-version", "2", "--steps", "10,100",
                 "--min-requests", "5")
    rollout = Rollout.objects.get()
    assert (rollout.steps, rollout.min_requests) == ([10, 100], 5)
    call_command("rollout", "pause", "chat-small")
    call_command("rollout", "status", "chat-small")
    assert "paused" in capsys.readouterr().out
