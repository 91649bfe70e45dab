"""A comparison of runs: what was asked (request), what runs (plan), its directory's files (folder),
the tuning search (space: the fields and ranges; axis: the default sampler; tuning: Optuna trials and
pruning; coverage: what a search tried; tuning_report),
running it (runner), one run's row (summary), the one table with one reference (table), seconds to
target on any link (projection) and on dedicated machines (calibrate), the report (report: put together;
report_figures: its numbers; report_words: its sentences; scale: what the scale ladder says of the
model's size), its plots and its HTML page (plots, report_html), and how often two runs' predictions
differ (churn). See docs/ARCHITECTURE.md."""
