"""The fleet's records (ReplicaTransition, ScalingDecision, RateSample) moved to fleet/ and the
rollouts (Rollout, RolloutStep) to rollouts/: they leave this app's state; their tables stay
(fleet/migrations/0001 and rollouts/migrations/0001 take them over under the same names)."""
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('models_registry', '0004_merge_canary'),
    ]

    operations = [
        # The tables exist (created by models_registry's migrations 0001-0004): only Django's
        # idea of which app owns them changes, never the database.
        migrations.SeparateDatabaseAndState(state_operations=[
            migrations.RemoveField(
                model_name='replicatransition',
                name='replica',
            ),
            migrations.RemoveField(
                model_name='rollout',
                name='canary_version',
            ),
            migrations.RemoveField(
                model_name='rollout',
                name='model',
            ),
            migrations.RemoveField(
                model_name='rollout',
                name='stable_version',
            ),
            migrations.RemoveField(
                model_name='rolloutstep',
                name='rollout',
            ),
            migrations.RemoveField(
                model_name='scalingdecision',
                name='model_version',
            ),
            migrations.DeleteModel(
                name='RateSample',
            ),
            migrations.DeleteModel(
                name='ReplicaTransition',
            ),
            migrations.DeleteModel(
                name='Rollout',
            ),
            migrations.DeleteModel(
                name='RolloutStep',
            ),
            migrations.DeleteModel(
                name='ScalingDecision',
            ),
        ], database_operations=[]),
    ]
