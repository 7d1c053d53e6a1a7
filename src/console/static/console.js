// summaryd console: everything here only improves pages that already work without it.
"use strict";

// "Select all" checkboxes tick or clear the row checkboxes of their form.
document.querySelectorAll("input[data-select-all]").forEach(function (all) {
  all.addEventListener("change", function () {
    var form = all.form;
    if (!form) return;
    form.querySelectorAll("input[type=checkbox][name=id]").forEach(function (box) {
      box.checked = all.checked;
    });
  });
});

// A bulk run's page follows its progress until it finishes, then shows the final counts.
var run = document.querySelector("[data-run-status]");
if (run) {
  var url = run.getAttribute("data-run-status");
  var poll = function () {
    fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (s) {
        if (!s) return;
        var bar = document.querySelector("progress[data-run-progress]");
        if (bar) { bar.max = Math.max(s.total, 1); bar.value = s.done + s.skipped + s.failed; }
        var text = document.querySelector("[data-run-text]");
        if (text) {
          text.textContent = s.done + " done, " + s.skipped + " already gone, " + s.failed +
            " failed of " + s.total + (s.finished ? " (finished)" : " (running)");
        }
        if (s.finished) { window.location.reload(); } else { setTimeout(poll, 1000); }
      })
      .catch(function () { setTimeout(poll, 3000); });
  };
  if (run.getAttribute("data-finished") !== "true") setTimeout(poll, 1000);
}
