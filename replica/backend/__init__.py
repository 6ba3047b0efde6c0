"""Pieces of the Triton Python-backend model (`model_repository/<model>/1/model.py`).

They run inside Triton's backend stub; `triton_python_backend_utils` is passed in, never
imported here, so the pure parts are testable without Triton.
"""
