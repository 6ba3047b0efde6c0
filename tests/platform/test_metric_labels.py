"""MetricStore's label fields (inference/observability/store.py): pure logic, no Redis (the
store's round trips are in test_observability_metrics.py)."""
import pytest

from inference.observability import families as f
from inference.observability.store import Batch


def test_a_sample_needs_exactly_its_familys_labels():
    """Pure logic: a missing, extra or misspelt label is refused (ValueError) before anything
    is added; the label values are written as strings, one field per label set."""
    labels = {"model": "m", "model_version": 1, "tier": "t"}
    for wrong in ({"model": "m", "model_version": "1"},
                  {**labels, "tenant": "x"},
                  {"model": "m", "model_version": "1", "teir": "t"}):
        batch = Batch()
        with pytest.raises(ValueError, match="labels"):
            batch.observe(f.TTFT, wrong, 0.1)
        assert batch.increments == {}
    batch = Batch()
    batch.observe(f.TTFT, labels, 0.1)
    batch.observe(f.TTFT, {**labels, "model_version": "1"}, 0.1)  # the same label set
    assert batch.increments[(f.TTFT.name, '["m","1","t"]|count')] == 2
