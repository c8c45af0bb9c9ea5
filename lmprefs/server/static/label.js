// Keyboard for the labeling page: 1-9 pick that option, s skips, f moves to the flag note (Enter sends the flag,
// Esc leaves the note), u changes the last answer (while the server offers it). Each answer is sent once: a second key press or click while the page reloads is ignored,
// so a fast double press cannot post a replay (the server would refuse it with 409 anyway).
(() => {
  "use strict";
  const form = document.getElementById("label-form");
  if (!form) return;
  const note = document.getElementById("note");
  let sent = false;

  form.addEventListener("submit", (event) => {
    if (sent) { event.preventDefault(); return; }
    sent = true;
    form.classList.add("sending");
    if (event.submitter) event.submitter.classList.add("chosen");
  });

  const send = (button) => { if (button && !sent) form.requestSubmit(button); };

  document.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey || event.isComposing) return;
    if (event.target === note) {
      if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); send(document.getElementById("flag")); }
      else if (event.key === "Escape") { note.blur(); }
      return;
    }
    if (event.target.closest("input, textarea, select")) return;
    if (/^[1-9]$/.test(event.key)) {
      const button = form.querySelector(`button.option[data-key="${event.key}"]`);
      if (button) { event.preventDefault(); send(button); }
    } else if (event.key === "s" || event.key === "S") {
      event.preventDefault();
      send(document.getElementById("skip"));
    } else if ((event.key === "u" || event.key === "U") && document.getElementById("undo")) {
      event.preventDefault();
      if (!sent) { sent = true; document.getElementById("undo-form").requestSubmit(); }
    } else if (event.key === "f" || event.key === "F") {
      event.preventDefault();  // focus the note without typing the "f" into it
      note.focus();
    }
  });
})();
