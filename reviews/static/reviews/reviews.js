// The review queue's keyboard and clock. No inline handlers: a strict CSP holds.
// j / k: next / previous card; a: Approve; r: Reject; n: focus the note field.
// The server decides every answer; these keys only click the card's real buttons.
(function () {
  "use strict";

  let selectedId = null;

  function cards() {
    return Array.from(document.querySelectorAll("#queue-list .card"));
  }

  function selected() {
    return selectedId ? document.getElementById(selectedId) : null;
  }

  function select(card) {
    const old = selected();
    if (old) old.classList.remove("selected");
    selectedId = card ? card.id : null;
    if (!card) return;
    card.classList.add("selected");
    card.focus({ preventScroll: true });
    card.scrollIntoView({ block: "nearest", behavior: "smooth" });
  }

  function typing(target) {
    return target instanceof Element && target.closest("input, textarea, select, [contenteditable]");
  }

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || typing(event.target)) return;
    const list = cards();
    if (!list.length) return;
    const current = selected();
    const index = current ? list.indexOf(current) : -1;
    let button = null;
    switch (event.key) {
      case "j": select(list[Math.min(index + 1, list.length - 1)]); break;
      case "k": select(list[Math.max(index - 1, 0)]); break;
      case "a": case "r":
        button = current && current.querySelector('button[data-key="' + event.key + '"]');
        if (!button || button.disabled) return;
        button.click();
        break;
      case "n": {
        const note = current && current.querySelector("textarea[name=note]");
        if (!note) return;
        note.focus();
        break;
      }
      default: return;
    }
    event.preventDefault();
  });

  // Clicking into a card selects it, so the keys act on what the reviewer looks at.
  document.addEventListener("click", function (event) {
    const card = event.target instanceof Element && event.target.closest("#queue-list .card");
    if (card && card.id !== selectedId) {
      const old = selected();
      if (old) old.classList.remove("selected");
      selectedId = card.id;
      card.classList.add("selected");
    }
  });

  // "Edit arguments" opens the card's JSON editor: the arguments field is sent only
  // while it is open (a disabled field is not submitted), and "Approve with these
  // arguments" stands in for the plain Approve.
  document.addEventListener("click", function (event) {
    const toggle = event.target instanceof Element && event.target.closest("button.edit-args");
    if (!toggle) return;
    const form = toggle.closest("form");
    const editor = document.getElementById(toggle.getAttribute("aria-controls"));
    if (!form || !editor) return;
    const open = editor.hidden;
    editor.hidden = !open;
    toggle.setAttribute("aria-expanded", String(open));
    toggle.textContent = open ? "Cancel edit" : "Edit arguments";
    const field = editor.querySelector("textarea[name=args]");
    field.disabled = !open;
    const plain = form.querySelector('button[data-key="a"]');
    if (plain) plain.hidden = open;
    if (open) field.focus();
  });

  // Filters apply as soon as one is picked; the Filter button stays for keyboards.
  document.addEventListener("change", function (event) {
    const select = event.target instanceof Element && event.target.closest("form.filters select");
    if (select) select.form.requestSubmit();
  });

  // htmx swaps nothing on an error status: say what the server refused, as plain text.
  document.addEventListener("htmx:responseError", function (event) {
    const form = event.target instanceof Element && event.target.closest("form.decide");
    if (!form) return;
    let box = form.querySelector(".decide-error");
    if (!box) {
      box = document.createElement("p");
      box.className = "decide-error";
      box.setAttribute("role", "alert");
      form.appendChild(box);
    }
    const xhr = event.detail.xhr;
    box.textContent = "Not recorded (" + xhr.status + "): " + (xhr.status === 403 ? "only reviewers can decide." : xhr.responseText.slice(0, 300));
  });

  // A decided card is swapped in place: keep it marked as the selection.
  document.addEventListener("htmx:afterSettle", function () {
    const card = selected();
    if (card) card.classList.add("selected");
  });

  // Cards on screen are kept as they are between polls (hx-preserve), so their
  // waiting time is advanced here, in the same format the server renders.
  function duration(seconds) {
    const s = Math.max(0, Math.floor(seconds));
    if (s < 60) return s + " s";
    let m = Math.floor(s / 60);
    if (m < 60) return m + " min";
    let h = Math.floor(m / 60); m = m % 60;
    if (h < 24) return m ? h + " h " + m + " min" : h + " h";
    const d = Math.floor(h / 24); h = h % 24;
    return h ? d + " d " + h + " h" : d + " d";
  }

  window.setInterval(function () {
    const now = Date.now() / 1000;
    document.querySelectorAll("#queue-list .card:not(.is-decided) time[data-since]").forEach(function (el) {
      el.textContent = duration(now - Number(el.dataset.since));
    });
  }, 5000);

  // The time left to answer, every second; under a fifth of it the card is marked
  // (the server marks it the same way when it renders the card).
  function countdown() {
    const now = Date.now() / 1000;
    document.querySelectorAll("#queue-list .card:not(.is-decided) .expires[data-until]").forEach(function (el) {
      const left = Number(el.dataset.until) - now;
      const time = el.querySelector("time");
      if (time) time.textContent = duration(left);
      el.classList.toggle("expiring", left * 5 < Number(el.dataset.total));
    });
  }
  window.setInterval(countdown, 1000);
})();
