"""Markers and shared fixtures of the replica tests. `-m "not slow"` skips the real-tritonserver
end-to-end tests."""
import pytest

from replica.engine.models.loader import default_model_path


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes tens of seconds (starts real processes, loads a model)")
    config.addinivalue_line("markers", "e2e: runs a real tritonserver replica end to end")


@pytest.fixture(scope="module")
def model_path() -> str:
    """The bundled SmolLM2 GGUF; the test is skipped where it is not installed."""
    try:
        return default_model_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
