"""Signals of the registry. `replica_states_changed(sender=Replica, replica_ids=[...])` is sent
by code that changes replica states with queryset `.update()` (which sends no post_save)."""
from django.dispatch import Signal

replica_states_changed = Signal()
