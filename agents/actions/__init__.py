"""What people do, one module by subject (as zulip's `zerver/actions/`): plain functions
named `noun_verb` with keyword-only arguments, shared by the pages, the API, the
commands, the gateway, Slack and email links. Single-row rules stay model methods."""
