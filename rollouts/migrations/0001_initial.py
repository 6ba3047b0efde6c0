"""Canary rollouts, taken over from models_registry with their tables (see
models_registry/migrations/0005)."""
import django.db.models.deletion
import rollouts.models
from django.db import migrations, models


APP = "rollouts"
MODELS = ("rollout", "rolloutstep")


def move_content_types(apps, schema_editor):
    """Permissions, admin log entries and group grants point at content types: move the rows
    to the new app label (a fresh database has none yet; post_migrate creates them)."""
    ContentType = apps.get_model("contenttypes", "ContentType")
    for model in MODELS:
        if not ContentType.objects.filter(app_label=APP, model=model).exists():
            ContentType.objects.filter(app_label="models_registry", model=model).update(app_label=APP)


def move_content_types_back(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    ContentType.objects.filter(app_label=APP, model__in=MODELS).update(app_label="models_registry")


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('contenttypes', '0002_remove_content_type_name'),
        ('models_registry', '0005_move_fleet_and_rollout_tables'),
    ]

    operations = [
        # The tables exist (created by models_registry's migrations 0001-0004): only Django's
        # idea of which app owns them changes, never the database.
        migrations.SeparateDatabaseAndState(state_operations=[
            migrations.CreateModel(
                name='Rollout',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('state', models.CharField(choices=[('running', 'Running'), ('paused', 'Paused'), ('promoted', 'Promoted'), ('rolled_back', 'Rolled Back')], default='running', max_length=16)),
                    ('steps', models.JSONField(default=rollouts.models.default_steps)),
                    ('step_index', models.PositiveIntegerField(default=0)),
                    ('traffic_percent', models.FloatField(default=5.0)),
                    ('step_started_at', models.DateTimeField()),
                    ('window_s', models.PositiveIntegerField(default=600)),
                    ('step_min_s', models.PositiveIntegerField(default=300)),
                    ('min_requests', models.PositiveIntegerField(default=50)),
                    ('max_error_rate_delta', models.FloatField(default=0.02)),
                    ('max_latency_ratio', models.FloatField(default=1.5)),
                    ('latency_slack_ms', models.FloatField(default=25.0)),
                    ('min_agreement', models.FloatField(default=0.8)),
                    ('probe_max_tokens', models.PositiveIntegerField(default=24)),
                    ('probe_step_index', models.IntegerField(default=-1)),
                    ('probe_result', models.JSONField(blank=True, default=dict)),
                    ('last_evaluated_at', models.DateTimeField(blank=True, null=True)),
                    ('last_evidence', models.JSONField(blank=True, default=dict)),
                    ('created_by', models.CharField(blank=True, default='', max_length=150)),
                    ('created_at', models.DateTimeField(auto_now_add=True)),
                    ('finished_at', models.DateTimeField(blank=True, null=True)),
                    ('canary_version', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='rollouts_as_canary', to='models_registry.modelversion')),
                    ('model', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='rollouts', to='models_registry.model')),
                    ('stable_version', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='rollouts_as_stable', to='models_registry.modelversion')),
                ],
                options={
                    'db_table': 'models_registry_rollout',
                    'ordering': ['-created_at'],
                },
            ),
            migrations.CreateModel(
                name='RolloutStep',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('kind', models.CharField(choices=[('start', 'Start'), ('advance', 'Advance'), ('promote', 'Promote'), ('rollback', 'Rollback'), ('pause', 'Pause'), ('resume', 'Resume')], max_length=16)),
                    ('from_percent', models.FloatField()),
                    ('to_percent', models.FloatField()),
                    ('automatic', models.BooleanField(default=False)),
                    ('actor', models.CharField(blank=True, default='', max_length=150)),
                    ('reason', models.TextField(blank=True, default='')),
                    ('evidence', models.JSONField(blank=True, default=dict)),
                    ('occurred_at', models.DateTimeField()),
                    ('rollout', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='history', to='rollouts.rollout')),
                ],
                options={
                    'db_table': 'models_registry_rolloutstep',
                    'ordering': ['rollout', 'occurred_at', 'pk'],
                },
            ),
            migrations.AddConstraint(
                model_name='rollout',
                constraint=models.UniqueConstraint(condition=models.Q(('state__in', ['running', 'paused'])), fields=('model',), name='one_live_rollout_per_model'),
            ),
        ], database_operations=[]),
        migrations.RunPython(move_content_types, move_content_types_back),
    ]
