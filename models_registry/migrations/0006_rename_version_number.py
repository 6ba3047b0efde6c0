# Renames ModelVersion.version to version_number (issue 15: "version" named five things). The
# unique constraint is dropped and re-created around the rename so its state names the new field.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('models_registry', '0005_move_fleet_and_rollout_tables'),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='modelversion',
            options={'ordering': ['model__name', '-version_number']},
        ),
        migrations.RemoveConstraint(
            model_name='modelversion',
            name='unique_model_version',
        ),
        migrations.RenameField(
            model_name='modelversion',
            old_name='version',
            new_name='version_number',
        ),
        migrations.AddConstraint(
            model_name='modelversion',
            constraint=models.UniqueConstraint(fields=('model', 'version_number'), name='unique_model_version'),
        ),
    ]
