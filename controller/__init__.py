"""mindp P4Runtime controller: pipeline, forwarding, jobs, workers, slots, stats.

Library API in controller.controller.Controller (docs/CONTROLLER.md); the
console command `mindp-ctl` is controller.cli.
"""
