"""What leaves Airlock: outbox events written with transitions (events) and their
delivery (delivery: signed webhooks, Slack, the reviewers' digest)."""
