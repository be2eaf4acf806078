// Airlock's only script besides htmx: no inline handlers anywhere, so a strict CSP holds.
(function () {
  "use strict";

  // The nav badge carries the pending count (data-count). Its first value is the
  // baseline; each later change is said once, politely, in the page's one live region.
  let announced = null;

  function announce() {
    const badge = document.querySelector("#nav-badge[data-count]");
    const region = document.getElementById("announcer");
    if (!badge || !region) return;
    const count = Number(badge.dataset.count);
    if (announced !== null && count !== announced) {
      region.textContent = count === 0 ? "No calls waiting for review."
        : count + " call" + (count === 1 ? "" : "s") + " waiting for review.";
    }
    announced = count;
  }

  document.addEventListener("DOMContentLoaded", announce);
  document.addEventListener("htmx:afterSettle", announce);
})();
