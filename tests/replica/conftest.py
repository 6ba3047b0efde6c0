"""Markers for the replica tests. `-m "not slow"` skips the real-tritonserver end-to-end tests."""


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes tens of seconds (starts real processes, loads a model)")
    config.addinivalue_line("markers", "e2e: runs a real tritonserver replica end to end")
