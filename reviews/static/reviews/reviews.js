// The review queue's keyboard and clock. No inline handlers: a strict CSP holds.
// j / k: focus the next / previous card; in the focused card, a: Approve, r: Reject,
// n: the note field. The keys act only on the card holding focus, and the
// "Single-key shortcuts" switch turns them off (remembered in this browser).
// The server decides every answer; these keys only click the card's real buttons.
(function () {
  "use strict";

  const OFF = "airlock.shortcuts.off";

  function cards() {
    return Array.from(document.querySelectorAll("#queue-list .card"));
  }

  function typing(target) {
    return target instanceof Element && target.closest("input, textarea, select, [contenteditable]");
  }

  function enabled() {
    const toggle = document.getElementById("shortcuts");
    return Boolean(toggle && toggle.checked);
  }

  document.addEventListener("DOMContentLoaded", function () {
    const toggle = document.getElementById("shortcuts");
    if (!toggle) return;
    toggle.checked = window.localStorage.getItem(OFF) !== "1";
    toggle.addEventListener("change", function () {
      if (toggle.checked) window.localStorage.removeItem(OFF);
      else window.localStorage.setItem(OFF, "1");
    });
  });

  document.addEventListener("keydown", function (event) {
    if (!enabled() || event.ctrlKey || event.metaKey || event.altKey || typing(event.target)) return;
    const target = event.target instanceof Element ? event.target : document.body;
    const current = target.closest("#queue-list .card");
    // j / k also start from a page where nothing has focus yet; nothing else does.
    if (!current && target !== document.body) return;
    const list = cards();
    const index = current ? list.indexOf(current) : -1;
    let button = null;
    switch (event.key) {
      case "j": case "k": {
        const next = list[event.key === "j" ? Math.min(index + 1, list.length - 1) : Math.max(index - 1, 0)];
        if (!next) return;
        next.focus({ preventScroll: true });
        next.scrollIntoView({ block: "nearest", behavior: "smooth" });
        break;
      }
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

  // A decision swaps its card in place, and the button that had focus goes with it:
  // focus returns to the decided card, so the next Tab continues from there.
  let deciding = null;
  document.addEventListener("htmx:beforeRequest", function (event) {
    const form = event.target instanceof Element && event.target.closest("form.decide");
    const card = form && form.closest(".card");
    if (card && card.contains(document.activeElement)) deciding = card.id;
  });

  function refocus(settled) {
    const card = deciding && document.getElementById(deciding);
    // Wait for the decided card itself (a poll may settle first); a refused answer
    // leaves the pending card, whose disabled button dropped focus as well.
    if (!card || (settled && card.querySelector("form.decide"))) return;
    deciding = null;
    const active = document.activeElement;
    if (!active || active === document.body || !active.isConnected) card.focus({ preventScroll: true });
  }

  document.addEventListener("htmx:afterSettle", function () { refocus(true); });
  document.addEventListener("htmx:afterRequest", function (event) {
    if (event.detail.failed) window.setTimeout(function () { refocus(false); }, 0);
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
})();
