"""CSV export of admin querysets (usage rows, invoices, invoice lines), streamed."""
from __future__ import annotations

import csv

from django.http import StreamingHttpResponse


class _Echo:
    def write(self, value: str) -> str:
        return value


def csv_response(filename: str, header: list[str], rows) -> StreamingHttpResponse:
    writer = csv.writer(_Echo())
    lines = (writer.writerow(row) for row in _with_header(header, rows))
    response = StreamingHttpResponse(lines, content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


def _with_header(header, rows):
    yield header
    yield from rows
