"""One request id, end to end through real processes: the client's X-Request-Id comes back in
the header and the reply, is on daphne's JSON log line about the request, on the usage row, and
in the real replica's log (it reached tritonserver as Triton's request id)."""
import json
import re
import uuid

import httpx
import pytest

from billing.models import UsageRecord
from tests.e2e.conftest import LOG_DIR
from tests.support.billing import drain, reset_usage_stream
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def replica_log_text() -> str:
    launcher = (LOG_DIR / "replica-smollm2.log").read_text(errors="replace")
    return "\n".join(open(path, errors="replace").read()
                     for path in set(re.findall(r"\(log: (\S+)\)", launcher)))


@pytest.mark.parametrize("replica_server", ["smollm2"], indirect=True)
def test_request_id_from_header_to_log_usage_row_and_replica(fleet):
    reset_usage_stream()
    request_id = f"e2e-{uuid.uuid4().hex[:12]}"
    reply = httpx.post(f"{fleet.base_url}/v1/generate", timeout=120,
                       headers={**fleet.auth, "X-Request-Id": request_id},
                       json={"model": "chat-small", "max_tokens": 3,
                             "messages": [{"role": "user", "content": "Hi"}]})
    assert reply.status_code == 200, reply.text
    assert reply.headers["X-Request-Id"] == request_id == reply.json()["id"]

    drain()  # the usage stream -> PostgreSQL (what the billing consumer does)
    row = UsageRecord.objects.get(request_id=request_id)
    assert row.output_tokens == 3

    def daphne_line():
        for line in (LOG_DIR / "daphne.log").read_text(errors="replace").splitlines():
            if request_id in line and line.startswith("{"):
                record = json.loads(line)
                if record.get("event", "").startswith("generation"):
                    return record
        return None

    record = wait_until(daphne_line, 30, "daphne's log line for the request", period_s=0.1)
    assert record["request_id"] == request_id and record["model"] == "chat-small"
    assert record["tenant_id"] == row.tenant_id and record["level"] == "info"
    wait_until(lambda: f"request {request_id}: " in replica_log_text(), 30,
               "the replica's log line for the request", period_s=0.1)
