"""The delivery wing: cron-side offer delivery: the session, the claim and pull, pacing (docs/worker/delivery.md)."""
