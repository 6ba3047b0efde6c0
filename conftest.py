"""Root conftest: keeps the repository root importable; per-area fixtures live under tests/."""
