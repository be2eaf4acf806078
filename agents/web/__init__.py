"""The operators' and launchers' pages: views, forms, urls, the timeline and the runs
list with their repeated fragments, and how money and durations read."""
