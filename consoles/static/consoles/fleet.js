// The live fleet page: keeps the replica table current from /ws/admin/fleet (no reload).
(function () {
  "use strict";
  var table = document.getElementById("fleet");
  var body = table.tBodies[0];
  var status = document.getElementById("fleet-status");

  function setStatus(state, text) { status.dataset.state = state; status.textContent = text; }

  function cell(text, cls) {
    var td = document.createElement("td");
    if (cls) td.className = cls;
    td.textContent = text;
    return td;
  }

  function upsert(row) {
    var empty = body.querySelector("tr.empty");
    if (empty) empty.remove();
    var tr = document.getElementById("replica-" + row.id);
    var fresh = !tr;
    if (fresh) {
      tr = document.createElement("tr");
      tr.id = "replica-" + row.id;
      tr.dataset.replica = row.id;
      for (var i = 0; i < 8; i++) tr.appendChild(document.createElement("td"));
      tr.cells[5].className = "state"; tr.cells[6].className = "load";
      tr.cells[7].className = "heartbeat"; tr.cells[6].textContent = "-";
      body.appendChild(tr);
    }
    var before = tr.cells[5].textContent;
    tr.cells[0].textContent = row.id;
    tr.cells[1].textContent = row.model + " v" + row.version_number;
    tr.cells[2].textContent = row.grpc_address;
    tr.cells[3].textContent = row.node;
    tr.cells[4].textContent = row.zone;
    var badge = document.createElement("span");
    badge.className = "badge state-" + row.state;
    badge.textContent = row.state;
    tr.cells[5].replaceChildren(badge);
    tr.cells[7].textContent = row.last_heartbeat || "-";
    if (!fresh && before !== row.state) {
      tr.classList.remove("changed"); void tr.offsetWidth; tr.classList.add("changed");
    }
  }

  function connect() {
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    var socket = new WebSocket(scheme + location.host + "/ws/admin/fleet");
    socket.onopen = function () { setStatus("live", "Live: updates arrive as they happen."); };
    socket.onmessage = function (event) {
      var msg = JSON.parse(event.data);
      if (msg.type === "replicas") msg.rows.forEach(upsert);
      else if (msg.type === "load") {
        Object.keys(msg.load).forEach(function (id) {
          var tr = document.getElementById("replica-" + id);
          if (tr) tr.cells[6].textContent = msg.load[id];
        });
      }
    };
    socket.onclose = function (event) {
      if (event.code === 4403) {
        setStatus("closed", "Not allowed: your account may not view replicas.");
        return;
      }
      setStatus("closed", "Disconnected: retrying in 3 s (rows may be stale).");
      setTimeout(connect, 3000);
    };
  }
  connect();
})();
