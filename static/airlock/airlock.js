// Airlock's only script besides htmx: no inline handlers anywhere, so a strict CSP holds.
