"""Scheduling plugins by role: producers, filters, scorers, pickers."""
