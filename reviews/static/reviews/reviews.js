// The review queue's keyboard and clock. No inline handlers: a strict CSP holds.
// With the "Single-key shortcuts" switch on (off by default, so typing never triggers a
// key; remembered in this browser): j / k focus the next / previous stop (a card, or
// any element with a data-card attribute, such as a group); in the focused stop,
// c: Claim, a: Approve, r: Reject, n: the note field, x: select the focused row's
// checkbox (in a group); Esc: back from a field to its card. What happened is said in
// the page's live region (#queue-announce), for screen readers.
// The server decides every answer; these keys only click the card's real buttons.
(function () {
  "use strict";

  const ON = "airlock.shortcuts";

  function cards() {
    return Array.from(document.querySelectorAll("#queue-list .card, #queue-list [data-card]"));
  }

  function stopOf(element) {
    return element instanceof Element ? element.closest("#queue-list .card, #queue-list [data-card]") : null;
  }

  function typing(target) {
    return target instanceof Element && target.closest("input:not([type=checkbox]), textarea, select, [contenteditable]");
  }

  function enabled() {
    const toggle = document.getElementById("shortcuts");
    return Boolean(toggle && toggle.checked);
  }

  // The live region: cleared first, so the same words said twice are read twice.
  function announce(text) {
    const region = document.getElementById("queue-announce");
    if (!region || !text) return;
    region.textContent = "";
    window.setTimeout(function () { region.textContent = text; }, 50);
  }

  function callOf(stop) {
    return stop && stop.dataset.approvalId ? "call " + stop.dataset.approvalId : "this card";
  }

  document.addEventListener("DOMContentLoaded", function () {
    const toggle = document.getElementById("shortcuts");
    if (!toggle) return;
    toggle.checked = window.localStorage.getItem(ON) === "on";
    toggle.addEventListener("change", function () {
      if (toggle.checked) window.localStorage.setItem(ON, "on");
      else window.localStorage.removeItem(ON);
      announce(toggle.checked ? "Single-key shortcuts on" : "Single-key shortcuts off");
    });
  });

  // What the server answered, for the live region: the decision and the claim each
  // send an event with the response (HX-Trigger).
  const VERDICTS = { approved: "Approved", rejected: "Rejected", expired: "Expired", denied: "Denied" };
  document.addEventListener("approvalDecided", function (event) {
    const d = event.detail || {};
    if (d.won) announce((VERDICTS[d.status] || "Decided") + " call " + d.id);
    else announce("Call " + d.id + " was already decided: nothing changed");
  });
  document.addEventListener("approvalClaimed", function (event) {
    const d = event.detail || {};
    announce(d.message || "");
  });

  // Esc leaves a field of a card (the note, the edited arguments) for the card itself,
  // so the single keys act again; the text typed stays in the field.
  document.addEventListener("keydown", function (event) {
    if (event.key !== "Escape" || !typing(event.target)) return;
    const card = stopOf(event.target);
    if (!card) return;
    event.preventDefault();
    card.focus({ preventScroll: true });
  });

  function press(current, key) {
    const button = current && current.querySelector('button[data-key="' + key + '"]');
    if (!button || button.disabled || button.hidden) return false;
    button.click();
    return true;
  }

  document.addEventListener("keydown", function (event) {
    if (!enabled() || event.ctrlKey || event.metaKey || event.altKey || typing(event.target)) return;
    const target = event.target instanceof Element ? event.target : document.body;
    const current = stopOf(target);
    // j / k also start from a page where nothing has focus yet; nothing else does.
    if (!current && target !== document.body) return;
    const list = cards();
    const index = current ? list.indexOf(current) : -1;
    switch (event.key) {
      case "j": case "k": {
        const next = list[event.key === "j" ? Math.min(index + 1, list.length - 1) : Math.max(index - 1, 0)];
        if (!next) return;
        if (!next.hasAttribute("tabindex")) next.setAttribute("tabindex", "-1");
        next.focus({ preventScroll: true });
        next.scrollIntoView({ block: "nearest", behavior: "smooth" });
        break;
      }
      case "c": {
        if (!current) return;
        if (!press(current, "c")) {
          const held = current.querySelector(".claimed");
          announce(held ? held.textContent : "You cannot claim " + callOf(current));
        }
        break;
      }
      case "a": case "r":
        if (!press(current, event.key)) return;
        break;
      case "n": {
        const note = current && current.querySelector("textarea[name=note]");
        if (!note) return;
        note.focus();
        break;
      }
      case "x": {
        // The row holding focus, else the stop's first row: its checkbox toggles.
        const row = target.closest("tr, [data-row]");
        const scope = row && current.contains(row) ? row : current;
        const box = scope && scope.querySelector("input[type=checkbox]");
        if (!box || box.disabled) return;
        box.click();
        announce((box.checked ? "Selected " : "Unselected ") + (box.getAttribute("aria-label") || "the row"));
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

  // A group's "Select all shown" box checks or clears every row of its table, and a row
  // checked by hand sets it (all, none, or some: indeterminate). Only rows shown can be
  // checked, and the form posts exactly those.
  document.addEventListener("change", function (event) {
    const box = event.target instanceof Element ? event.target : null;
    const table = box && box.closest("table.group-rows");
    if (!table) return;
    const rows = Array.from(table.querySelectorAll('input[name="ids"]'));
    const all = table.querySelector("[data-select-all]");
    if (box === all) {
      rows.forEach(function (row) { row.checked = all.checked; });
    } else if (all) {
      all.checked = rows.every(function (row) { return row.checked; });
      all.indeterminate = !all.checked && rows.some(function (row) { return row.checked; });
    }
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

  // Claim / Release swap the card's claim line, and the button with it: focus goes
  // back to the card, so the keys and Tab continue from there.
  let claiming = null;
  document.addEventListener("htmx:beforeRequest", function (event) {
    const form = event.target instanceof Element && event.target.closest("form.claim-form");
    const card = form && stopOf(form);
    if (card) claiming = card.id;
  });
  document.addEventListener("htmx:afterRequest", function (event) {
    if (!claiming || !(event.detail.elt instanceof Element) || !event.detail.elt.closest(".claim-form, .claim")) return;
    const id = claiming;
    claiming = null;
    window.setTimeout(function () {
      const card = document.getElementById(id);
      const active = document.activeElement;
      if (card && (!active || active === document.body || !active.isConnected)) card.focus({ preventScroll: true });
    }, 0);
  });

  // "Show N more" replaces itself with the next cards: focus moves to the first of
  // them (its title is announced), so the reader goes on where the list grew.
  let appendedAfter = null;
  document.addEventListener("htmx:beforeRequest", function (event) {
    if (!(event.target instanceof Element) || event.target.id !== "queue-more") return;
    const list = cards();
    appendedAfter = list.length ? list[list.length - 1].id : "";
  });

  function focusAppended() {
    if (appendedAfter === null) return;
    const list = cards();
    const last = appendedAfter ? document.getElementById(appendedAfter) : null;
    const next = list[last ? list.indexOf(last) + 1 : 0];
    if (!next) return;  // not swapped yet (a poll settled first)
    appendedAfter = null;
    const active = document.activeElement;
    if (!active || active === document.body || !active.isConnected) next.focus();
  }

  // Untrusted text sits in a box of limited height; on a narrow screen the highlighted
  // instruction can fall below its fold. Each box new on the page is scrolled once so
  // its first highlighted passage shows, with a line of what precedes it.
  function revealSuspects() {
    document.querySelectorAll("pre.untrusted-text:not([data-revealed])").forEach(function (box) {
      const mark = box.querySelector("mark.suspect");
      if (!mark || !box.clientHeight) return;
      box.dataset.revealed = "1";
      const top = mark.getBoundingClientRect().top - box.getBoundingClientRect().top + box.scrollTop;
      const line = parseFloat(window.getComputedStyle(box).lineHeight) || 20;
      if (top + mark.offsetHeight > box.scrollTop + box.clientHeight) box.scrollTop = Math.max(0, top - line);
    });
  }
  document.addEventListener("DOMContentLoaded", revealSuspects);
  document.addEventListener("htmx:afterSettle", revealSuspects);

  document.addEventListener("htmx:afterSettle", function () { refocus(true); focusAppended(); });
  document.addEventListener("htmx:afterRequest", function (event) {
    if (event.detail.failed) window.setTimeout(function () { refocus(false); }, 0);
  });

  // A 409 that carries a card (HTML) is a stale card: the call changed since it was
  // shown. The server refused the answer and sent the card as the call stands now;
  // swap it in so the reviewer sees the new arguments and who edited them.
  document.addEventListener("htmx:beforeSwap", function (event) {
    const xhr = event.detail.xhr;
    const card = event.target instanceof Element && event.target.closest(".card");
    if (!card || xhr.status !== 409) return;
    if (!(xhr.getResponseHeader("Content-Type") || "").startsWith("text/html")) return;
    event.detail.shouldSwap = true;
    event.detail.isError = false;
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
