# ScalingDecision.signals -> readings (issue 15: "signals" named four things; glossary: load readings).

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0001_initial'),
    ]

    operations = [
        migrations.RenameField(
            model_name='scalingdecision',
            old_name='signals',
            new_name='readings',
        ),
    ]
