"""A comparison of runs: what runs (plan), running it (runner), the one table with one reference
(table), seconds to target on any link (projection), the report and its plots (report, plots),
and how often two runs' predictions differ (churn)."""
