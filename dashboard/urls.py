from django.urls import path

from dashboard.views import auth, invoices, keys, overview, playground

app_name = "dashboard"
urlpatterns = [
    path("", overview.overview, name="overview"),
    path("login/", auth.login_view, name="login"),
    path("logout/", auth.logout_view, name="logout"),
    path("keys/", keys.keys, name="keys"),
    path("keys/<int:key_id>/revoke/", keys.revoke_key, name="revoke_key"),
    path("invoices/", invoices.invoices, name="invoices"),
    path("invoices/<int:invoice_id>/", invoices.invoice_detail, name="invoice"),
    path("invoices/<int:invoice_id>/download/", invoices.invoice_csv, name="invoice_csv"),
    path("playground/", playground.playground, name="playground"),
    path("playground/stream/", playground.stream, name="playground_stream"),
]
