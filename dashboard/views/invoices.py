"""The tenant's invoices: list, one invoice with its lines, and its CSV download."""
from django.shortcuts import get_object_or_404, render

from billing.csv_export import csv_response
from dashboard.access import member_view
from dashboard.selectors import tenant_invoices

LINE_COLUMNS = ["kind", "model_name", "num_requests", "input_tokens", "cached_tokens",
                "output_tokens", "amount"]


@member_view
def invoices(request):
    return render(request, "dashboard/invoices.html",
                  {"tenant": request.tenant, "invoices": tenant_invoices(request.tenant.pk)})


@member_view
def invoice_detail(request, invoice_id: int):
    invoice = get_object_or_404(tenant_invoices(request.tenant.pk), pk=invoice_id)
    return render(request, "dashboard/invoice_detail.html",
                  {"tenant": request.tenant, "invoice": invoice,
                   "lines": invoice.lines.order_by("kind", "model_name")})


@member_view
def invoice_csv(request, invoice_id: int):
    invoice = get_object_or_404(tenant_invoices(request.tenant.pk), pk=invoice_id)
    header = ["invoice", "tenant", "period_start", "period_end", "currency", *LINE_COLUMNS]
    fixed = [invoice.pk, request.tenant.name, invoice.period_start.isoformat(),
             invoice.period_end.isoformat(), invoice.currency]
    rows = ([*fixed, *line] for line in
            invoice.lines.order_by("kind", "model_name").values_list(*LINE_COLUMNS))
    name = f"invoice-{request.tenant.name}-{invoice.period_start:%Y-%m}.csv"
    return csv_response(name, header, rows)
