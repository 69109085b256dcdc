"""The producer (CONTRACT §9): what a sweep enqueues, its runs and budgets, and cron."""
