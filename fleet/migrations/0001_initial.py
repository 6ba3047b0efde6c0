"""The fleet's records, taken over from models_registry with their tables (see
models_registry/migrations/0005)."""
import django.db.models.deletion
from django.db import migrations, models


APP = "fleet"
MODELS = ("ratesample", "replicatransition", "scalingdecision")


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
                name='RateSample',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('at', models.DateTimeField(db_index=True)),
                    ('window_s', models.FloatField()),
                    ('num_requests', models.PositiveIntegerField()),
                    ('model_version', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='rate_samples', to='models_registry.modelversion')),
                ],
                options={
                    'db_table': 'models_registry_ratesample',
                    'ordering': ['at'],
                },
            ),
            migrations.CreateModel(
                name='ReplicaTransition',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('from_state', models.CharField(blank=True, default='', max_length=16)),
                    ('to_state', models.CharField(max_length=16)),
                    ('reason', models.CharField(max_length=300)),
                    ('at', models.DateTimeField(db_index=True)),
                    ('replica', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='transitions', to='models_registry.replica')),
                ],
                options={
                    'db_table': 'models_registry_replicatransition',
                    'ordering': ['at', 'pk'],
                },
            ),
            migrations.CreateModel(
                name='ScalingDecision',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('at', models.DateTimeField(db_index=True)),
                    ('action', models.CharField(choices=[('scale_up', 'Scale Up'), ('scale_down', 'Scale Down'), ('hold', 'Hold')], max_length=16)),
                    ('current_replicas', models.PositiveIntegerField()),
                    ('recommended_replicas', models.PositiveIntegerField()),
                    ('desired_replicas', models.PositiveIntegerField()),
                    ('reason', models.CharField(max_length=300)),
                    ('signals', models.JSONField(default=dict)),
                    ('model_version', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='scaling_decisions', to='models_registry.modelversion')),
                ],
                options={
                    'db_table': 'models_registry_scalingdecision',
                    'ordering': ['-at', '-pk'],
                },
            ),
        ], database_operations=[]),
        migrations.RunPython(move_content_types, move_content_types_back),
    ]
