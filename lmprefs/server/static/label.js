// Keyboard for the labeling page: z, x, c set the confidence (1-3) the answer is sent with, 1-9 pick that option,
// s skips, f moves to the flag note (Enter sends the flag, Esc leaves the note), u changes the last answer (while
// the server offers it). On a ranking question 1-9 (or a click) add that option to the order instead, Backspace
// takes back the last one, r starts over and Enter submits once every option is ranked; the server checks the
// order again. Each answer is sent once: a second key press or click while the page reloads is ignored, so a fast
// double press cannot post a replay (the server would refuse it with 409 anyway).
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

  const ranking = form.dataset.kind === "ranking";
  const order = [];  // option numbers (1-based, as displayed), best first
  const options = [...form.querySelectorAll("button.option")];
  const showOrder = () => {
    document.getElementById("ranking").value = order.join(",");
    document.getElementById("ranking-order").textContent =
      order.length ? order.map((k, i) => `${i + 1}. option ${k}`).join(" · ") : "none yet";
    for (const b of options) {
      const at = order.indexOf(Number(b.dataset.key));
      b.querySelector(".rank").textContent = at < 0 ? "" : `#${at + 1}`;
      b.classList.toggle("ranked", at >= 0);
    }
    document.getElementById("ranking-submit").disabled = order.length !== options.length;
  };
  const rank = (key) => { if (!sent && !order.includes(key)) { order.push(key); showOrder(); } };
  if (ranking) {
    for (const b of options) b.addEventListener("click", () => rank(Number(b.dataset.key)));
    document.getElementById("ranking-reset").addEventListener("click", () => { order.length = 0; showOrder(); });
  }

  document.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey || event.isComposing) return;
    if (event.target === note) {
      if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); send(document.getElementById("flag")); }
      else if (event.key === "Escape") { note.blur(); }
      return;
    }
    if (event.target.closest("input:not([type=radio]), textarea, select")) return;
    const sure = /^[zxc]$/i.test(event.key) && form.querySelector(`input[name=confidence][data-key="${event.key.toLowerCase()}"]`);
    if (sure) { event.preventDefault(); sure.checked = true; return; }
    if (ranking && /^[1-9]$/.test(event.key)) {
      event.preventDefault();
      if (Number(event.key) <= options.length) rank(Number(event.key));
    } else if (ranking && event.key === "Backspace") {
      event.preventDefault();
      order.pop();
      showOrder();
    } else if (ranking && (event.key === "r" || event.key === "R")) {
      event.preventDefault();
      order.length = 0;
      showOrder();
    } else if (ranking && event.key === "Enter") {  // even on a focused option: Enter submits, never re-ranks
      event.preventDefault();
      if (order.length === options.length) send(document.getElementById("ranking-submit"));
    } else if (/^[1-9]$/.test(event.key)) {
      const button = form.querySelector(`button.option[data-key="${event.key}"]`);
      if (button) { event.preventDefault(); send(button); }
    } else if ((event.key === "s" || event.key === "S") && document.getElementById("skip")) {
      event.preventDefault();
      send(document.getElementById("skip"));
    } else if ((event.key === "u" || event.key === "U") && document.getElementById("undo")) {
      event.preventDefault();
      if (!sent) { sent = true; document.getElementById("undo-form").requestSubmit(); }
    } else if (event.key === "f" || event.key === "F") {
      event.preventDefault();  // focus the note without typing the "f" into it
      if (note) note.focus();  // a practice question has no flag
    }
  });
})();
