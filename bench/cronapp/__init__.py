"""An app for the cron benchmark (bench/cron.py): its ``workflows`` module
declares a schedule, which worker processes find at start-up."""
