"""The floor of the house: helpers that import nothing above them (JSON safety, fault
points, hand-written SQL reads and prepared statements, sanitising, MCP annotation
mapping, the API-key variable name). The ORM and everything above may use them."""
