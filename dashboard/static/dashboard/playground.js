// The playground: posts the prompt (session cookie + CSRF token) and appends the streamed
// tokens (SSE: `event: token` ... `event: done` | `event: error`) to the page as they arrive.
(function () {
  "use strict";
  var form = document.getElementById("playground");
  if (!form) return;
  var output = document.getElementById("pg-output");
  var status = document.getElementById("pg-status");
  var send = document.getElementById("pg-send");
  var stop = document.getElementById("pg-stop");
  var controller = null;

  function finish(text) {
    status.textContent = text;
    output.setAttribute("aria-busy", "false");
    send.disabled = false; stop.disabled = true; controller = null;
  }

  function handle(block) {
    var name = "message", data = "";
    block.split("\n").forEach(function (line) {
      if (line.indexOf("event: ") === 0) name = line.slice(7);
      else if (line.indexOf("data: ") === 0) data += line.slice(6);
    });
    if (!data) return;
    var payload = JSON.parse(data);
    if (name === "token") output.textContent += payload.text;
    else if (name === "done") {
      var u = payload.usage || {};
      finish("Done (" + payload.finish_reason + "): " + u.input_tokens + " input, " +
             u.output_tokens + " output tokens.");
    } else if (name === "error") finish("Error: " + payload.error.message);
  }

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    output.textContent = "";
    status.textContent = "Waiting for the first token…";
    output.setAttribute("aria-busy", "true");
    send.disabled = true; stop.disabled = false;
    controller = new AbortController();
    var body = {
      model: form.model.value,
      prompt: form.prompt.value,
      max_tokens: parseInt(form.max_tokens.value, 10)
    };
    fetch(form.dataset.url, {
      method: "POST", body: JSON.stringify(body), signal: controller.signal,
      credentials: "same-origin",
      headers: {"Content-Type": "application/json",
                "X-CSRFToken": form.csrfmiddlewaretoken.value}
    }).then(function (response) {
      if (!response.ok) {
        return response.json().then(function (err) {
          finish("Error " + response.status + ": " + err.error.message);
        });
      }
      status.textContent = "Streaming…";
      var reader = response.body.getReader();
      var decoder = new TextDecoder();
      var buffer = "";
      function pump() {
        return reader.read().then(function (chunk) {
          if (chunk.done) { if (controller) finish("Stream ended."); return; }
          buffer += decoder.decode(chunk.value, {stream: true});
          var cut;
          while ((cut = buffer.indexOf("\n\n")) >= 0) {
            handle(buffer.slice(0, cut));
            buffer = buffer.slice(cut + 2);
          }
          return pump();
        });
      }
      return pump();
    }).catch(function (err) {
      finish(err.name === "AbortError" ? "Stopped." : "Error: " + err.message);
    });
  });

  stop.addEventListener("click", function () { if (controller) controller.abort(); });
})();
