"""``serve``: the schedule's configuration and the APScheduler service."""
