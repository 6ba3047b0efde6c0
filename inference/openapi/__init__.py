"""The API's OpenAPI 3.1 document, built from the DRF serializers that validate requests."""
