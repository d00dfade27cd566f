"""Scheduler-process package."""
